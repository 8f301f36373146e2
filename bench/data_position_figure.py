"""Figure 12c: what elastic data positions cost, per batch and at a resume.

(a) Per batch. A prepared data loader plans each pass in optimizer steps and notes
every batch it hands out (:mod:`elastic_train.worker.data_position`), where a plain
loader has torch's ``DistributedSampler``. Both load the same batches of the figure 12
workload's inputs (rank 0 of 2, ``num_workers=0``, no device copy); the figure times
one whole epoch of each, the two interleaved block by block, in CPU time of the calling
thread, and sets the mean of the paired per-batch differences (95 % bootstrap interval)
against the CPU time of one training step of figure 12's model on one such batch,
measured by the same process. Goal: at most 0.5 % of a step.

(b) At a resume. The time from a checkpoint's saved positions (2 ranks) to the first
batch of 3 ranks, for an epoch of 1,000,000 samples, resumed at 0 % and at 90 % of it:
the merge, the plan of the rest and the first batch's indices (the loader never reads
a skipped sample). Goal: 90 % costs less than 50 ms more than 0 %.

Run: ``python -m bench --only data_position``.
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from bench.report import Table
from bench.stats import Difference
from bench.workload import build_model, make_optimizer, make_shard
from elastic_train.torch.train_loop_utils import prepared_loader
from elastic_train.worker.data_position import EpochPosition

if TYPE_CHECKING:
    from bench.suite import Suite

GOAL_PERCENT = 0.5
GOAL_RESUME_MS = 50.0
RESUME_SAMPLES = 1_000_000


def data_position(suite: Suite) -> list[Table]:
    cfg = suite.profile.overhead
    torch.set_num_threads(1)
    x, y = make_shard(cfg, 0)
    dataset = TensorDataset(x.repeat(2, 1), y.repeat(2))  # rank 0 of 2 gets one shard
    blocks = max(4, suite.profile.overhead_pairs)
    plain, ours = [], []
    for _ in range(blocks):
        plain.append(_cpu_per_batch(_plain_loader(dataset, cfg.batch)))
        ours.append(_cpu_per_batch(_prepared(dataset, cfg.batch)))
    step = _training_step_cpu(cfg, x[: cfg.batch], y[: cfg.batch])
    return [_per_batch_table(plain, ours, step, cfg.batch), _resume_table(suite.profile.repeat)]


def _plain_loader(dataset: TensorDataset, batch: int) -> DataLoader:
    sampler = DistributedSampler(dataset, num_replicas=2, rank=0, shuffle=True, seed=0)
    return DataLoader(dataset, batch_size=batch, sampler=sampler)


def _prepared(dataset: TensorDataset, batch: int):
    loader = DataLoader(dataset, batch_size=batch, shuffle=True)
    return prepared_loader(loader, EpochPosition(0, 2), seed=0, device=None)


def _cpu_per_batch(loader) -> float:
    """CPU µs of this thread per batch over one epoch of ``loader``."""
    start, batches = time.thread_time(), 0
    for _ in loader:
        batches += 1
    return (time.thread_time() - start) / batches * 1e6


def _training_step_cpu(cfg, x: torch.Tensor, y: torch.Tensor, steps: int = 30) -> float:
    """CPU µs of this thread per optimizer step of figure 12's model on one batch."""
    model = build_model(cfg)
    optimizer = make_optimizer(cfg, model)

    def step() -> None:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    step()  # warm-up
    start = time.thread_time()
    for _ in range(steps):
        step()
    return (time.thread_time() - start) / steps * 1e6


def _per_batch_table(plain: list[float], ours: list[float], step: float, batch: int) -> Table:
    diff = Difference.paired(plain, ours)
    share = None if diff is None else diff.mean / step * 100
    table = Table("Figure 12c (a) — elastic data position per batch (CPU µs of the calling "
                  "thread per batch; mean of paired differences [95 % interval])",
                  ["DistributedSampler loader, µs", "prepared loader, µs", "difference, µs",
                   "training step, µs", "% of a step", f"goal ≤ {GOAL_PERCENT} %"])
    table.add(f"{statistics.median(plain):.0f}", f"{statistics.median(ours):.0f}",
              diff.fmt(1) if diff else "n/a", f"{step:.0f}",
              "n/a" if share is None else f"{share:+.2f}",
              "n/a" if share is None else ("PASS" if share <= GOAL_PERCENT else "FAIL"))
    table.notes.append(f"Batch {batch}, rank 0 of 2, {len(plain)} paired epochs; a step is "
                       "figure 12's model, forward, backward and SGD on one batch, in one "
                       "thread, without the all-reduce (which a real step adds).")
    return table


def _resume_ms(fraction: float) -> float:
    """ms from 2 ranks' saved positions at ``fraction`` of the epoch to 3 ranks' first
    batch of dataset indices (rank 0's)."""
    taken = int(RESUME_SAMPLES * fraction) // 2
    states = {r: {"epoch": 0, "batch": 0, "taken": taken, "prefix": 0, "beyond": [],
                  "world": 2, "size": RESUME_SAMPLES} for r in range(2)}
    dataset = TensorDataset(torch.zeros(RESUME_SAMPLES, 1))
    loader = _prepared_at(dataset, 3)
    start = time.perf_counter()
    loader.restore(states)
    next(iter(loader))
    return (time.perf_counter() - start) * 1e3


def _prepared_at(dataset: TensorDataset, world: int):
    loader = DataLoader(dataset, batch_size=32, shuffle=True)
    return prepared_loader(loader, EpochPosition(0, world), seed=0, device=None)


def _resume_table(repeat: int) -> Table:
    runs = max(3, repeat)
    at = {f: sorted(_resume_ms(f) for _ in range(runs)) for f in (0.0, 0.9)}
    median = {f: statistics.median(v) for f, v in at.items()}
    extra = median[0.9] - median[0.0]
    table = Table("Figure 12c (b) — a resume at another world size (2 -> 3 ranks) of an epoch "
                  f"of {RESUME_SAMPLES:,} samples: ms to the first batch, median (min-max)",
                  ["at 0 %, ms", "at 90 %, ms", "90 % minus 0 %, ms",
                   f"goal < {GOAL_RESUME_MS:.0f} ms"])
    table.add(*(f"{median[f]:.1f} ({at[f][0]:.1f}-{at[f][-1]:.1f})" for f in (0.0, 0.9)),
              f"{extra:+.1f}", "PASS" if extra < GOAL_RESUME_MS else "FAIL")
    table.notes.append(f"{runs} runs each; the merge of the saved positions, the plan of the "
                       "rest of the epoch and the first batch, in one process.")
    return table
