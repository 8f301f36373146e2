"""Figures 1-3, 5 and 6: cold start, steps, checkpoints, memory and scaling, from the
runs :class:`~bench.suite.Suite` makes of the main variants (figures 1, 2 and 5 read the
same runs)."""

from __future__ import annotations

import os
from collections.abc import Callable

from bench.measure import Sample, phase_order
from bench.report import Table
from bench.stats import Summary, Target, fmt_ratio, ratio, with_target
from bench.suite import Suite, missing_row, others_cpu, summary_of
from bench.variants import (
    ET_EPOCH,
    ET_LAUNCH,
    ET_STEP,
    FLOOR,
    MAIN,
    TORCH_SAVE,
)

STEPS_EPOCH_TARGET = Target(0.99, at_least=True)
STEPS_STEP_TARGET = Target(0.97, at_least=True)
COLD_START_TARGET = Target(0.80, at_least=False)
AGENT_MEMORY_TARGET = Target(50.0, at_least=False)

def cold_start(suite: Suite) -> list[Table]:
    """Figure 1: launch → first step on rank 0, launch → job end, and the phases."""
    runs = suite.main_runs()
    floor_first = summary_of(runs[FLOOR.key], lambda s: s.cold_first_step_s)
    floor_end = summary_of(runs[FLOOR.key], lambda s: s.cold_end_s)
    table = Table("Figure 1 — cold start (s, median (min–max))",
                  ["variant", "launch → first step", "ratio to (a), target",
                   "launch → job end", "ratio to (a)", "others' CPU (cores)"])
    for variant in MAIN:
        if missing_row(table, variant, runs):
            continue
        first = summary_of(runs[variant.key], lambda s: s.cold_first_step_s)
        end = summary_of(runs[variant.key], lambda s: s.cold_end_s)
        target = with_target(ratio(first, floor_first), COLD_START_TARGET) \
            if variant is not FLOOR else "floor"
        table.add(variant.label, first.fmt(), target, end.fmt(),
                  fmt_ratio(ratio(end, floor_end)), others_cpu(runs[variant.key]))
    cfg = suite.profile.main
    table.notes += [
        f"{suite.profile.workers} workers, {cfg.epochs} epochs × {cfg.steps_per_epoch} steps; "
        "the target applies to the first step.",
        "others' CPU: mean CPU use of processes outside the benchmark during the run "
        f"(/proc/stat minus the run's own CPU time), of {os.cpu_count()} cores; anything well "
        "above 0 makes the run slower by an unknown amount.",
    ]
    return [table, _phase_table(runs)]


def _phase_table(runs: dict[str, list[Sample]]) -> Table:
    variants = [v for v in MAIN if v is not ET_STEP and v.key in runs]
    table = Table("Figure 1b — where the cold start goes (rank 0, s, median)",
                  ["phase", *[v.label for v in variants]])
    names = sorted({n for v in variants for s in runs[v.key] for n in s.phases},
                   key=lambda n: (phase_order(n), n))
    for name in names:
        table.add(name, *[summary_of(runs[v.key], lambda s, n=name: s.phases.get(n)).fmt()
                          for v in variants])
    table.notes.append("From the workers' timestamps: process start (from /proc), imports done "
                       "(torchrun-style scripts only), process group joined / train function "
                       "entered, restore done, first step done. Under the Python API user code "
                       "starts after the session, so imports and process group are one phase.")
    return table


def steps(suite: Suite) -> list[Table]:
    """Figure 2: steady-state steps/s after the first epoch."""
    runs = suite.main_runs()
    floor = summary_of(runs[FLOOR.key], lambda s: s.steps_per_s)
    saving = summary_of(runs[TORCH_SAVE.key], lambda s: s.steps_per_s)
    table = Table("Figure 2 — steady-state steps/s (rank 0, after epoch 1)",
                  ["variant", "steps/s", "ratio to (a), target", "ratio to (b)",
                   "best run / (a)'s best run", "others' CPU (cores)"])
    targets = {ET_EPOCH.key: STEPS_EPOCH_TARGET, ET_STEP.key: STEPS_STEP_TARGET,
               ET_LAUNCH.key: STEPS_EPOCH_TARGET}
    for variant in MAIN:
        if missing_row(table, variant, runs):
            continue
        value = summary_of(runs[variant.key], lambda s: s.steps_per_s)
        r = ratio(value, floor)
        if variant is FLOOR:
            cell = "floor"
        elif variant.key in targets:
            cell = with_target(r, targets[variant.key])
        else:
            cell = fmt_ratio(r)
        best = value.best / floor.best if value.ok and floor.ok else None
        table.add(variant.label, value.fmt(2), cell, fmt_ratio(ratio(value, saving)),
                  fmt_ratio(best), others_cpu(runs[variant.key]))
    cfg = suite.profile.main
    table.notes += [
        f"Steps per epoch / median duration of epochs 2..{cfg.epochs} on rank 0 (epoch end to "
        "epoch end, so each epoch's report()/checkpoint time is included; the median resists "
        "bursts of load from other processes).",
        "(c) reports metrics + a checkpoint (rank 0's torch.save into a temporary directory) "
        "every epoch; the '/step' row adds a metrics-only report() after every other step.",
        "The verdict uses the ratio of medians. Other processes only ever slow a run down, so "
        "the ratio of the best runs is the better estimate when others' CPU is not ~0.",
    ]
    return [table, _epoch_cost_table(runs)]


def _pooled(samples: list[Sample], get: Callable[[Sample], list[float]],
            scale: float = 1000.0) -> Summary:
    """Every value of every run (ms by default): per-epoch costs, not per-run medians."""
    return Summary.of([v * scale for s in samples if s.ok for v in get(s)])


def _epoch_cost_table(runs: dict[str, list[Sample]]) -> Table:
    """Figure 2b: what each epoch costs on rank 0 beyond the floor's epoch."""
    floor = _pooled(runs[FLOOR.key], lambda s: s.epoch_s)
    table = Table("Figure 2b — where the steady-state time goes (rank 0, ms per epoch or call, "
                  "median (min–max) over all epochs of all runs)",
                  ["variant", "epoch", "epoch − (a)'s epoch", "torch.save / epoch",
                   "report() with checkpoint / epoch", "metrics-only report() / call"])
    for variant in MAIN:
        if variant.key not in runs:
            continue
        samples = runs[variant.key]
        epoch = _pooled(samples, lambda s: s.epoch_s)
        extra = f"{epoch.median - floor.median:+.1f}" if epoch.ok and floor.ok else "n/a"
        table.add(variant.label, epoch.fmt(1), extra if variant is not FLOOR else "floor",
                  _pooled(samples, lambda s: s.save_s).fmt(1),
                  _pooled(samples, lambda s: s.report_s).fmt(1),
                  _pooled(samples, lambda s: s.step_report_s).fmt(2))
    table.notes.append("Timed inside the workers with time.time() around each call; "
                       "n/a = the variant does not make that call.")
    return table


def checkpoint(suite: Suite) -> list[Table]:
    """Figure 3: how long a ~100 MB checkpoint blocks the training loop."""
    profile = suite.profile
    base = profile.checkpoint
    sync = ET_EPOCH.workload(base).replace(upload_mode="SYNC")
    runs = suite.run_set("checkpoint", [TORCH_SAVE, ET_EPOCH], base, profile.workers)
    runs["sync"] = suite.run_set("checkpoint", [ET_EPOCH], sync, profile.workers)[ET_EPOCH.key]

    plain = _pooled(runs[TORCH_SAVE.key], lambda s: s.save_s, scale=1.0)
    size = summary_of(runs[TORCH_SAVE.key] + runs[ET_EPOCH.key], lambda s: s.checkpoint_mb)
    table = Table(f"Figure 3 — time a {size.median:.0f} MiB checkpoint blocks rank 0 "
                  "(s, median (min–max) over every epoch of every run)",
                  ["variant", "torch.save", "report() blocks", "total blocked",
                   "ratio to plain torch.save", "others' CPU (cores)"])
    table.add(TORCH_SAVE.label + " (plain torch.save to local disk)", plain.fmt(3), "—",
              plain.fmt(3), "floor", others_cpu(runs[TORCH_SAVE.key]))
    for key, label in ((ET_EPOCH.key, "(c) elastic-train, ASYNC (default)"),
                       ("sync", "(c) elastic-train, SYNC")):
        save = _pooled(runs[key], lambda s: s.save_s, scale=1.0)
        rep = _pooled(runs[key], lambda s: s.report_s, scale=1.0)
        total = _pooled(runs[key], lambda s: s.checkpoint_total_s, scale=1.0)
        table.add(label, save.fmt(3), rep.fmt(3), total.fmt(3), fmt_ratio(ratio(total, plain)),
                  others_cpu(runs[key]))
    table.notes.append(f"State = model + SGD momentum + a {base.payload_mb} MiB payload tensor; "
                       f"{base.epochs} epochs × {base.steps_per_epoch} steps; storage is a "
                       "local temporary directory. Total blocked = torch.save + report() + "
                       "removing the temporary directory (for (b): torch.save + rename).")
    return [table]


def memory(suite: Suite) -> list[Table]:
    """Figure 5: peak RSS (VmHWM) of the agent/driver and of each worker."""
    runs = suite.main_runs()
    workers = suite.profile.workers
    floor = summary_of(runs[FLOOR.key], lambda s: s.agent_rss_mb)
    table = Table("Figure 5 — peak memory, VmHWM (MiB, median (min–max))",
                  ["variant", "agent / driver process",
                   *[f"worker rank {r}" for r in range(workers)],
                   "other processes, summed", "agent − (a)'s agent, target",
                   "all processes, PSS", "PSS ratio to (a)"])
    floor_pss = summary_of(runs[FLOOR.key], lambda s: s.pss_total_mb)
    for variant in MAIN:
        if missing_row(table, variant, runs):
            continue
        samples = runs[variant.key]
        agent = summary_of(samples, lambda s: s.agent_rss_mb)
        delta = agent.median - floor.median if agent.ok and floor.ok else None
        if variant is FLOOR:
            cell = "floor"
        elif delta is None:
            cell = "n/a"
        else:
            cell = (f"{delta:+.1f} MiB {AGENT_MEMORY_TARGET.describe()} "
                    f"{AGENT_MEMORY_TARGET.verdict(delta)}")
        pss = summary_of(samples, lambda s: s.pss_total_mb)
        table.add(variant.label, agent.fmt(0),
                  *[summary_of(samples, lambda s, r=r: s.worker_rss_mb.get(r)).fmt(0)
                    for r in range(workers)],
                  summary_of(samples, lambda s: s.helper_rss_mb).fmt(0), cell, pss.fmt(0),
                  fmt_ratio(ratio(pss, floor_pss)))
    table.notes.append("Sampled from /proc/<pid>/status every 0.2 s during the figure 1/2 runs; "
                       "for (c) the driver runs the elastic agent in-process. 'Other "
                       "processes' is elastic-train's worker zygote (torch imported once, "
                       "its pages shared with the workers it forks, so VmHWM counts them "
                       "twice) and its per-worker stand-ins. For (e) the "
                       "column is Ray's driver process alone: Ray's own GCS, raylet and "
                       "Train controller processes come on top of it.")
    table.notes.append("All processes, PSS: the largest sum over the run's process tree of "
                       "each process's proportional set size (a page shared by N processes "
                       "counts 1/N in each), sampled like VmHWM -- the memory the whole run "
                       "really holds. Workers forked from elastic-train's zygote share the "
                       "pages of everything it preloaded (torch, torch._dynamo) instead of "
                       "importing their own copies.")
    return [table]


def scaling(suite: Suite) -> list[Table]:
    """Figure 6: cold start and steps/s with 1, 2, 4 workers, (a) vs (c)."""
    profile = suite.profile
    table = Table("Figure 6 — scaling with the number of workers (1 thread each)",
                  ["workers", "(a) first step s", "(c) first step s", "ratio",
                   "(a) steps/s", "(c) steps/s", "ratio", "others' CPU (cores)"])
    for workers in profile.scaling_workers:
        runs = suite.run_set(f"scaling/{workers}", [FLOOR, ET_EPOCH], profile.scaling, workers)
        a, c = runs[FLOOR.key], runs[ET_EPOCH.key]
        a_first, c_first = (summary_of(x, lambda s: s.cold_first_step_s) for x in (a, c))
        a_steps, c_steps = (summary_of(x, lambda s: s.steps_per_s) for x in (a, c))
        table.add(workers, a_first.fmt(), c_first.fmt(), fmt_ratio(ratio(c_first, a_first)),
                  a_steps.fmt(), c_steps.fmt(), fmt_ratio(ratio(c_steps, a_steps)),
                  others_cpu(a + c))
    cfg = profile.scaling
    table.notes += [
        f"Batch {cfg.batch} per worker (weak scaling); {cfg.epochs} epochs × "
        f"{cfg.steps_per_epoch} steps.",
        f"The machine has {os.cpu_count()} cores: 4 workers are oversubscribed, so both harnesses "
        "get exactly one torch thread per worker to keep the comparison fair.",
    ]
    return [table]


