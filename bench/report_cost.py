"""What one metrics-only ``report()`` costs a rank, next to the collectives it could use.

    python -m bench.report_cost [--workers 2] [--calls 300] [--profile]

A profiling aid for figure 2's per-step overhead, not a figure of BENCHMARKS.md:
``fit()`` runs N workers that call ``report()`` ``--calls`` times between small
matmuls, and then time an ``all_reduce`` of two integers and an
``all_gather_object`` of what ``report()`` used to gather, on the same group.
``--profile`` adds rank 0's cProfile of the ``report()`` calls. Each rank prints
one ``RESULT`` line.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import tempfile
import time

import torch
import torch.distributed as dist

import elastic_train as et
from elastic_train.torch import TorchTrainer


def _per_call_ms(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return 1000 * (time.perf_counter() - start) / calls


def train_func(config: dict) -> None:
    rank = et.get_context().get_world_rank()
    world = et.get_context().get_world_size()
    x = torch.randn(256, 256)
    for _ in range(20):  # warm-up
        et.report({"warm": 1.0})
    profile = cProfile.Profile() if rank == 0 and config["profile"] else None

    def one_report() -> None:
        y = x @ x
        if profile:
            profile.enable()
        et.report({"loss": float(y[0, 0])})
        if profile:
            profile.disable()

    report_ms = _per_call_ms(one_report, config["calls"])
    all_reduce_ms = _per_call_ms(lambda: dist.all_reduce(torch.zeros(2, dtype=torch.int32)),
                                 config["calls"])
    gather_ms = _per_call_ms(lambda: dist.all_gather_object([None] * world, (None, {}, None)),
                             config["calls"])
    print(f"RESULT rank {rank}: report() {report_ms:.3f} ms/call (incl. a 256x256 matmul); "
          f"all_reduce of 2 ints {all_reduce_ms:.3f} ms; all_gather_object {gather_ms:.3f} ms",
          flush=True)
    if profile:
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(20)
        print(out.getvalue(), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.report_cost",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    storage = tempfile.mkdtemp(prefix="report_cost_")
    TorchTrainer(  # the workers' RESULT lines appear on the console, prefixed by rank
        train_func, train_loop_config={"calls": args.calls, "profile": args.profile},
        scaling_config=et.ScalingConfig(num_workers=args.workers),
        run_config=et.RunConfig(name="report_cost", storage_path=storage, verbose=0)).fit()

if __name__ == "__main__":
    main()
