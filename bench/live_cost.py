"""Figure 17b: what ``LiveState.step_done()`` costs a fault-free step (live recovery's bar:
<= 0.5 % of figure 12's 22 ms step on the CPU clock).

A 2-rank ``fit()`` trains figure 12's model (an MLP 512-1024-1024-10, 1.6 M parameters, SGD
with momentum, batches of 128 from ``prepare_data_loader``) with its state live, and
times each ``step_done()`` on rank 0: the thread's CPU clock and the wall clock, against
the step's own wall time (forward, backward, optimizer step). The first steps of the
run are left out (the copies' buffers are allocated at the first call).

    python -m bench --only live_cost         (the figure; --smoke: 60 steps)
    python -m bench.live_cost [--steps 400]   (the job alone: one line)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import TYPE_CHECKING

import torch
from torch.utils.data import DataLoader, TensorDataset

import elastic_train as et
from bench import procs
from bench.report import Table
from bench.variants import REPO, base_env
from elastic_train.torch import LiveState, TorchTrainer, prepare_data_loader, prepare_model

if TYPE_CHECKING:
    from bench.suite import Suite

WARM_UP = 20  # steps left out
BAR_S = 0.005 * 0.022  # 0.5 % of figure 12's 22 ms step


def _train(config: dict) -> dict:
    torch.manual_seed(0)
    model = prepare_model(torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(), torch.nn.Linear(1024, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data = TensorDataset(torch.randn(config["steps"] * 256, 512),
                         torch.randint(0, 10, (config["steps"] * 256,)))
    loader = prepare_data_loader(DataLoader(data, batch_size=128))
    live = LiveState(model=model, optimizer=optimizer, epoch=0)
    live.restore()
    cpu, wall, steps = [], [], []
    for x, y in loader:
        began = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        stepped, thread = time.perf_counter(), time.thread_time()
        live.step_done()
        cpu.append(time.thread_time() - thread)
        wall.append(time.perf_counter() - stepped)
        steps.append(stepped - began)
    et.report({"steps": live.steps})
    return {"cpu": cpu[WARM_UP:], "wall": wall[WARM_UP:], "step": steps[WARM_UP:]}


def measure(steps: int) -> dict:
    """The medians over rank 0's steps: step_done()'s CPU and wall seconds, the step's."""
    storage = tempfile.mkdtemp(prefix="bench-live-")
    try:
        times = TorchTrainer(
            _train, train_loop_config={"steps": steps},
            scaling_config=et.ScalingConfig(num_workers=2),
            run_config=et.RunConfig(storage_path=storage, name="live-cost", verbose=0),
        ).fit().return_value
    finally:
        shutil.rmtree(storage, ignore_errors=True)
    return {"cpu_s": statistics.median(times["cpu"]), "wall_s": statistics.median(times["wall"]),
            "step_s": statistics.median(times["step"]), "steps": len(times["cpu"])}


def live_cost(suite: Suite) -> list[Table]:
    """The figure: :func:`measure` in a process of its own."""
    table = Table("Figure 17b — what LiveState.step_done() costs a step (rank 0 of 2, "
                  "figure 12's model; median over the steps)",
                  ["steps", "CPU, µs", "wall, µs", "the step, ms", "CPU / step", "goal"])
    work = tempfile.mkdtemp(prefix="bench-live-cost-")
    try:
        out = os.path.join(work, "out.json")
        result = procs.run([sys.executable, "-m", "bench.live_cost", "--steps",
                            str(suite.profile.live_steps), "--json", out], base_env(1),
                           cwd=REPO, timeout_s=600, log_path=os.path.join(work, "log"),
                           memory=False)
        if not os.path.exists(out):
            suite.fatal_failures += 1
            suite.echo(result.output_tail[-600:])
            table.add("failed", "", "", "", "", "")
            return [table]
        with open(out) as f:
            data = json.load(f)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cpu, wall, step = data["cpu_s"], data["wall_s"], data["step_s"]
    table.add(data["steps"], f"{cpu * 1e6:.1f}", f"{wall * 1e6:.1f}", f"{step * 1e3:.1f}",
              f"{cpu / step:.3%}",
              f"≤ {BAR_S * 1e6:.0f} µs: {'PASS' if cpu <= BAR_S else 'MISS'}")
    table.notes.append(
        "What step_done() does: the copies of what changes outside the optimizer's step "
        "(buffers, the optimizer's settings, plain values), the session's data positions "
        "and report count, two clock reads; the parameters and the optimizer's state are "
        "not copied (docs/live-recovery.md). The first steps are left out (the copies' "
        "buffers are allocated there). The goal is 0.5 % of figure 12's 22 ms step.")
    return [table]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--json", default=None, help="write the medians to this file")
    args = parser.parse_args()
    data = measure(args.steps)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f)
    cpu, wall, step = data["cpu_s"], data["wall_s"], data["step_s"]
    print(f"step_done() on rank 0 over {data['steps']} steps: {cpu * 1e6:.1f} µs CPU, "
          f"{wall * 1e6:.1f} µs wall (median); the step itself {step * 1e3:.1f} ms: "
          f"{cpu / step:.3%} of it on the CPU clock")


if __name__ == "__main__":
    main()
