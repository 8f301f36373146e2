"""Figure 12b: what straggler scoring adds to each ``report()``, against a training step.

Straggler scores (:mod:`elastic_train.stragglers`) ride on every report: the rank's
:class:`~elastic_train.worker.step_times.StepClock` reads the clock around it, the
report's one all_reduce carries every rank's step time and node besides the flags it
carries anyway (``ControlGroup.any_rank_and_each`` instead of ``any_rank``), and
each rank computes the row's fields (``step_fields``: a median over the ranks).
Figure 12's paired runs cannot resolve 0.5 % (their 95 % intervals span several
per cent here), so this figure times these pieces themselves with the same method
-- CPU time of the calling thread, the two sides interleaved block by block, the
mean of the paired differences with a 95 % bootstrap interval -- and sets the
difference against the CPU time of one training step of figure 12's workload,
measured by the same processes:

- two real gloo processes on 127.0.0.1 call the real code: the report's collective
  without scoring (``any_rank(False, False)``) against the same with scoring
  (clock, ``any_rank_and_each`` with the slots of a job of N ranks, ``step_fields``
  over them), for N = 2, 64 and 1,024: each rank builds and decodes N slots, and
  the all_reduce carries them;
- what two processes cannot show: the all_reduce's latency across N real ranks
  (a ring of N hops carries the 16 bytes per rank alike with or without scores).

Run: ``python -m bench --only straggler_cost``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING

from bench.report import Table
from bench.stats import Difference
from bench.variants import base_env
from bench.workload import WorkloadConfig, build_model, make_optimizer, make_shard
from tests.support.paths import REPO
from tests.support.servers import free_port

if TYPE_CHECKING:
    from bench.suite import Suite

GOAL_PERCENT = 0.5
JOB_SIZES = (2, 64, 1024)
REPORTS_PER_BLOCK = 200
STEPS_TIMED = 30


def straggler_cost(suite: Suite) -> list[Table]:
    profile = suite.profile
    blocks = max(4, profile.overhead_pairs)
    with tempfile.TemporaryDirectory() as out:
        port, procs = free_port(), []
        for rank in range(2):
            cmd = [sys.executable, "-m", "bench.straggler_cost_figure", str(rank), str(port),
                   str(blocks), profile.overhead.to_json(), out]
            procs.append(subprocess.Popen(cmd, cwd=REPO, env=base_env(1)))
        try:
            codes = [p.wait(timeout=profile.timeout_s * 4) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if any(codes):
            suite.echo(f"  [straggler_cost] workers exited with {codes}")
            return [Table("Figure 12b — straggler scoring", ["result"], [["failed"]])]
        results = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(2)]
    return [_table(results, blocks, profile.overhead.steps_per_epoch)]


def _table(results: list[dict], blocks: int, steps: int) -> Table:
    table = Table("Figure 12b — what straggler scoring adds to a report() (CPU µs of the "
                  "calling thread per report; mean of paired differences [95 % interval])",
                  ["job size (ranks)", "report's collective, µs", "with scoring, µs",
                   "difference, µs", "training step, µs", "% of a step, a report per step",
                   f"% of a step, a report per {steps} steps", f"goal ≤ {GOAL_PERCENT} %"])
    step_us = statistics.fmean(r["step_us"] for r in results)
    for size in JOB_SIZES:
        base = [statistics.fmean(pair) for pair in zip(
            *(r["sizes"][str(size)]["base"] for r in results), strict=True)]
        scored = [statistics.fmean(pair) for pair in zip(
            *(r["sizes"][str(size)]["scored"] for r in results), strict=True)]
        diff = Difference.paired(base, scored)
        if diff is None:
            continue
        def share(us: float, every: int) -> float:
            return 100 * us / (step_us * every)

        table.add(f"{size:,}", f"{statistics.fmean(base):.0f}", f"{statistics.fmean(scored):.0f}",
                  diff.fmt(1), f"{step_us:.0f}",
                  f"{share(diff.mean, 1):+.3f} [{share(diff.low, 1):+.3f}, "
                  f"{share(diff.high, 1):+.3f}]",
                  f"{share(diff.mean, steps):+.4f}",
                  "PASS" if share(diff.mean, steps) <= GOAL_PERCENT else "MISS")
    table.notes += [
        f"2 gloo processes on 127.0.0.1, {blocks} blocks of {REPORTS_PER_BLOCK} reports per "
        "side, the sides alternating in order; means over both ranks. The training step: "
        f"the CPU time of one of figure 12's steps (forward, backward, optimizer; no "
        f"collective), the median of {STEPS_TIMED}, in the same processes.",
        f"The goal is checked at figure 12's cadence, a report per epoch of {steps} steps; a "
        "report per step is the worst case (Ray's examples report once per epoch).",
        "Not shown: the all_reduce's latency across N real ranks; its payload grows by 16 "
        "bytes per rank.",
    ]
    return table


# --- a worker process ---------------------------------------------------------------------

def _thread_us(fn, times: int) -> float:
    """CPU µs of this thread per call of ``fn``."""
    start = time.thread_time()
    for _ in range(times):
        fn()
    return (time.thread_time() - start) * 1e6 / times


def _step_us(cfg: WorkloadConfig, rank: int) -> float:
    """The median CPU µs of one training step of figure 12's workload."""
    import torch

    model = build_model(cfg)
    optimizer = make_optimizer(cfg, model)
    x, y = make_shard(cfg, rank)
    x, y = x[:cfg.batch], y[:cfg.batch]
    loss_fn = torch.nn.CrossEntropyLoss()

    def step() -> None:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()

    step()
    return statistics.median(_thread_us(step, 1) for _ in range(STEPS_TIMED))


def _worker(rank: int, port: int, blocks: int, cfg: WorkloadConfig, out: str) -> None:
    import torch
    import torch.distributed as dist

    from elastic_train.stragglers import step_fields
    from elastic_train.worker.control_group import ControlGroup
    from elastic_train.worker.step_times import StepClock

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    clock = StepClock()
    sizes = {}
    for size in JOB_SIZES:
        group = ControlGroup(size)  # the slots of a job of `size` ranks, over 2 real ones

        def plain(group: ControlGroup = group) -> None:
            group.any_rank(False, False)

        def scored(group: ControlGroup = group) -> None:
            clock.step()
            mine = clock.report_begins()
            _, (times, nodes) = group.any_rank_and_each((False, False), (mine, float(rank)))
            step_fields(times, [int(n) for n in nodes])
            clock.report_ends()

        base_us, scored_us = [], []
        for block in range(blocks):
            for side in ((plain, scored) if block % 2 else (scored, plain)):
                (base_us if side is plain else scored_us).append(
                    _thread_us(side, REPORTS_PER_BLOCK))
        sizes[str(size)] = {"base": base_us, "scored": scored_us}
    step_us = _step_us(cfg, rank)
    dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"sizes": sizes, "step_us": step_us}, f)


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
            WorkloadConfig.from_json(sys.argv[4]), sys.argv[5])
