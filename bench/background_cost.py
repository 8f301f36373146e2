"""What a background process at the lowest CPU priority costs a communicating training.

    python -m bench.background_cost [STEPS]

Two gloo ranks on 127.0.0.1 run a step of 8 all-reduces of 16 MB, each followed by
4 matmuls, then an AdamW-like update of 32 MB: a training that keeps this machine's
cores busy except while it waits in a collective (as figure 11b's FSDP job does).
The median step time (of ``STEPS``, default 12) is measured with nothing else
running, then beside one ``SCHED_IDLE`` process, the policy of our checkpoint
writers (:mod:`elastic_train.storage.background_priority`), doing either

- ``write``: ``torch.save`` of a 200 MB tensor, again and again (a writer's work), or
- ``spin``: a pure Python loop (no memory traffic, no I/O),

and alone again. Prints one JSON line: seconds per step and the ratio of steps/s to
the first ``alone``. Figure 11b's "steps during a write" goal (0.95x) is bounded by
the ``write`` row on the machine it runs on; the ``spin`` row shows how much of that
comes from a task merely running on a core the training's threads wake on, not
from what it does there.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist

from bench.procs import free_port
from bench.report import Table

PHASES = ("alone", "write", "spin", "alone again")
_TENSOR = 50_000_000  # 200 MB of float32


def _background(kind: str, directory: str) -> None:
    """The background process: ``kind``'s work under SCHED_IDLE until killed."""
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    tensor = torch.randn(_TENSOR) if kind == "write" else None
    for n in range(sys.maxsize):
        if tensor is not None:
            with open(os.path.join(directory, f"{n % 2}.pt"), "wb") as f:
                torch.save(tensor, f)
        else:
            total = 0
            for i in range(1_000_000):
                total += i


def _rank(rank: int, port: int, steps: int, directory: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    matrix = torch.randn(512, 512)
    grad, param, avg = torch.randn(8_000_000), torch.randn(8_000_000), torch.zeros(8_000_000)
    bucket = torch.randn(4_000_000)

    def step() -> float:
        began = time.perf_counter()
        for _ in range(8):
            dist.all_reduce(bucket)
            for _ in range(4):
                matrix @ matrix
        avg.mul_(0.9).add_(grad, alpha=0.1)
        param.add_(avg, alpha=-1e-3)
        return time.perf_counter() - began

    for _ in range(3):
        step()
    seconds = {}
    for phase in PHASES:
        dist.barrier()
        background = None
        if rank == 0 and phase in ("write", "spin"):
            background = subprocess.Popen([sys.executable, "-m", "bench.background_cost",
                                           "--background", phase, directory])
            time.sleep(1.0)  # its start-up (imports) is not what is measured
        dist.barrier()
        seconds[phase] = statistics.median(step() for _ in range(steps))
        dist.barrier()
        if background is not None:
            background.kill()
            background.wait()
    if rank == 0:
        print(json.dumps({"seconds_per_step": seconds,
                          "steps_per_s_ratio": {p: seconds["alone"] / s
                                                for p, s in seconds.items()}}), flush=True)
    dist.destroy_process_group()


def measure(steps: int) -> dict[str, dict[str, float]]:
    """One run of the two ranks; what rank 0 printed."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="background_cost_") as directory:
        ranks = [subprocess.Popen([sys.executable, "-m", "bench.background_cost", "--rank",
                                   str(rank), str(port), str(steps), directory],
                                  stdout=subprocess.PIPE, text=True)
                 for rank in (0, 1)]
        try:
            out, _ = ranks[0].communicate(timeout=600)
            ranks[1].wait(timeout=60)
        finally:
            for proc in ranks:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    if ranks[0].returncode:
        raise RuntimeError(f"bench.background_cost: rank 0 exited with {ranks[0].returncode}")
    return json.loads(out.strip().splitlines()[-1])


def table(runs: list[dict[str, dict[str, float]]]) -> Table:
    """Figure 11b's bound: each phase's seconds per step and steps/s ratio, per run."""
    result = Table("Figure 11b (bound) -- training steps beside a SCHED_IDLE process "
                   "(2 gloo ranks; s per step, median of each run)",
                   ["beside", "s per step", "steps/s / alone"])
    for phase in PHASES:
        result.add(phase, ", ".join(f"{r['seconds_per_step'][phase]:.3f}" for r in runs),
                   ", ".join(f"{r['steps_per_s_ratio'][phase]:.2f}" for r in runs))
    result.notes += [
        "`python -m bench.background_cost`: see its docstring. `write` is what a checkpoint "
        "writer does, `spin` a task that only runs (no memory traffic, no I/O); both "
        "under SCHED_IDLE, the lowest CPU priority Linux has, which our writers use.",
        "The `write` row is what figure 11b's 'steps during a write' can reach on this "
        "machine with any writer that runs while training runs; `spin` below 1.0 shows "
        "that a task merely running on a core the training's threads wake on slows them, "
        "whatever its priority.",
    ]
    return result


if __name__ == "__main__":
    if sys.argv[1:2] == ["--background"]:
        _background(sys.argv[2], sys.argv[3])
    elif sys.argv[1:2] == ["--rank"]:
        _rank(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    else:
        print(json.dumps(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 12)))
