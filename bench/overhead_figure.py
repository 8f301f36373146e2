"""Figure 12: elastic-train's steady-state cost per training step, against bare torchrun.

Wall time on this machine varies ±10 % between identical runs, which hides a
1-3 % regression. So this figure measures each step's *CPU time* inside the
workers (the training thread's clock, and the whole worker process's) as well
as its wall time, over many short runs made back to back -- (a), (b), (c),
(d), (a), (b), ... -- and reports the mean of the paired differences with a
95 % bootstrap interval, in microseconds per step and as a share of the
baseline's step. Steady state is every epoch after a run's first, each
epoch's checkpoint included. elastic-train's runs save the same state every
epoch as (b), bare torchrun with a hand-written ``torch.save``; so (c) − (b) and
(d) − (b) are what elastic-train itself costs (report, staging, upload thread,
commit, session), and (b) − (a) is what saving a checkpoint costs anyway.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from bench.report import Table
from bench.stats import Difference
from bench.variants import ET_EPOCH, ET_LAUNCH, ET_LAUNCH_METRICS, FLOOR, TORCH_SAVE, Variant

if TYPE_CHECKING:
    from bench.measure import Sample
    from bench.suite import Suite

GOAL_PERCENT = 1.0
METRICS_GOAL_PERCENT = 0.5  # issue #40's bar for the metric exporters
CLOCKS = (("wall", "wall time"), ("thread_cpu", "training thread's CPU"),
          ("process_cpu", "worker process's CPU (all threads)"))


# (variant, baseline, goal %): what the variant costs on top of the baseline (no goal: None).
COMPARISONS = ((TORCH_SAVE, FLOOR, None), (ET_EPOCH, TORCH_SAVE, GOAL_PERCENT),
               (ET_LAUNCH, TORCH_SAVE, GOAL_PERCENT),
               (ET_LAUNCH_METRICS, ET_LAUNCH, METRICS_GOAL_PERCENT))


def _paired(runs: dict[str, list[Sample]], variant: Variant, baseline: Variant, clock: str
            ) -> tuple[list[float], list[float]]:
    """(baseline, variant) µs per step of the repetitions where both succeeded."""
    pairs = [(a.step_us.get(clock), b.step_us.get(clock))
             for a, b in zip(runs[baseline.key], runs[variant.key], strict=True)]
    kept = [(a, b) for a, b in pairs if a is not None and b is not None]
    return [a for a, _ in kept], [b for _, b in kept]


def overhead(suite: Suite) -> list[Table]:
    """Figure 12: per-step cost of (b) over (a), and of (c) and (d) over (b), with
    confidence intervals."""
    profile = suite.profile
    variants = suite.variants(FLOOR, TORCH_SAVE, ET_EPOCH, ET_LAUNCH, ET_LAUNCH_METRICS)
    runs = suite.run_set("overhead", variants, profile.overhead, profile.workers,
                         repeat=profile.overhead_pairs)
    table = Table("Figure 12 — steady-state cost per step (µs per step; mean of paired "
                  "differences [95 % interval])",
                  ["variant − baseline", "clock", "baseline µs/step", "variant µs/step",
                   "difference µs/step", "difference % of baseline",
                   "goal (≤ % of baseline)"])
    for variant, baseline, goal_percent in COMPARISONS:
        if variant.key not in runs:
            continue
        name = f"{variant.label.split(' ', 1)[0]} − {baseline.label.split(' ', 1)[0]}"
        for clock, label in CLOCKS:
            base, mine = _paired(runs, variant, baseline, clock)
            diff = Difference.paired(base, mine)
            if diff is None:
                table.add(name, label, "n/a", "n/a", "n/a", "n/a", "n/a")
                continue
            mean = statistics.fmean(base)
            percent = 100 * diff.mean / mean
            goal = "—" if goal_percent is None else \
                f"{'PASS' if percent <= goal_percent else 'MISS'} (≤ {goal_percent:g} %)"
            table.add(name, label, f"{mean:.0f}", f"{statistics.fmean(mine):.0f}",
                      diff.fmt(), f"{percent:+.2f} [{100 * diff.low / mean:+.2f}, "
                      f"{100 * diff.high / mean:+.2f}]", goal)
    cfg = profile.overhead
    table.notes += [
        f"{profile.overhead_pairs} repetitions of each variant, interleaved; {cfg.epochs} "
        f"epochs × {cfg.steps_per_epoch} steps per run, the first epoch left out (warm-up); "
        f"{profile.workers} workers, 1 torch thread each. Means over the ranks of each run.",
        "CPU clocks count only the worker's own work, so load from other processes moves "
        "them far less than wall time; the verdict is on each clock's point estimate, "
        "the interval says how sure it is (an interval that contains 0 means no measurable "
        "overhead).",
        "(b), (c) and (d) save the same state once per epoch (rank 0's torch.save; (c) and "
        "(d) into a temporary directory they report); (a) saves nothing. The goal applies "
        "to elastic-train's own cost, (c) − (b) and (d) − (b), and to the Prometheus "
        "endpoint's, (d-m) − (d): the same launch with --metrics-port (its driver feeds "
        "the metrics from the agent's events and each poll of the run directory).",
    ]
    return [table]
