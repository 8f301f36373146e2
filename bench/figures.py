"""The figures: which runs each needs, and the table each one prints.

Figure 7 (storage) lives in :mod:`bench.storage_figure`, figure 8 (rendezvous) in
:mod:`bench.rendezvous_figure` (its lost node without and with a spare, 8b continued, in
:mod:`bench.node_loss_figure`), figure 9 (rendezvous at scale) in
:mod:`bench.rendezvous_scale_figure`, figures 10 and 11 (sharded checkpoints) in
:mod:`bench.sharded_figure`, figure 12 (overhead per step) in
:mod:`bench.overhead_figure` (12b, what straggler scoring costs, in
:mod:`bench.straggler_cost_figure`), figure 13 (a failure on one of three nodes) in
:mod:`bench.nodes_figure`, figure 14 (the soak) in :mod:`bench.soak_figure`, figure 15
(GPU: restarts on nccl) in :mod:`bench.gpu_figure`; each
runs processes of its own.

:class:`Suite` runs the variants (repetitions interleaved -- a, b, c, a, b,
c, ... -- so that drift of the machine hits every variant alike) and caches
the samples, since figures 1, 2 and 5 read the same runs. Every ratio is to
the floor (a) measured in the same invocation.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from bench.data_position_figure import data_position
from bench.gpu_figure import gpu
from bench.measure import FaultPlan, Sample, measure, phase_order
from bench.node_loss_figure import node_loss
from bench.nodes_figure import nodes
from bench.overhead_figure import overhead
from bench.peer_figure import peer_restore
from bench.profiles import Profile
from bench.recovery_figure import recovery
from bench.rendezvous_figure import rendezvous
from bench.rendezvous_scale_figure import rendezvous_scale
from bench.report import Table
from bench.sharded_figure import local_tier, shard_reads
from bench.soak_figure import soak
from bench.stats import Summary, Target, fmt_ratio, ratio, with_target
from bench.storage_figure import storage
from bench.straggler_cost_figure import straggler_cost
from bench.variants import (
    ET_EPOCH,
    ET_LAUNCH,
    ET_STEP,
    FLOOR,
    MAIN,
    RAY,
    TORCH_SAVE,
    Variant,
    launch_help,
    ray_available,
)
from bench.workload import WorkloadConfig

NOT_AVAILABLE = "not available here (not installed)"
STEPS_EPOCH_TARGET = Target(0.99, at_least=True)
STEPS_STEP_TARGET = Target(0.97, at_least=True)
COLD_START_TARGET = Target(0.80, at_least=False)
AGENT_MEMORY_TARGET = Target(50.0, at_least=False)

Printer = Callable[[str], None]


class Suite:
    """Runs and caches the measurements of one invocation."""

    def __init__(self, profile: Profile, echo: Printer):
        self.profile = profile
        self.echo = echo
        self.launch_available = launch_help() is not None
        self.failures: list[Sample] = []
        self.fatal_failures = 0
        self._main: dict[str, list[Sample]] | None = None

    def variants(self, *wanted: Variant) -> list[Variant]:
        """``wanted``, without (d) when ``elastic-train launch`` does not exist and
        without (e) when Ray is not installed."""
        return [v for v in wanted if (v is not ET_LAUNCH or self.launch_available)
                and (v is not RAY or ray_available())]

    def run_set(self, name: str, variants: Sequence[Variant], base: WorkloadConfig,
                workers: int, max_restarts: int = 0, fault: FaultPlan | None = None,
                failures_are_results: bool = False,
                repeat: int | None = None) -> dict[str, list[Sample]]:
        """``repeat`` runs (default: the profile's) of each variant, interleaved, failed ones
        included (``ok=False``).

        Failed runs are also listed in :attr:`failures`; they make the suite fail unless
        ``failures_are_results`` (figure 4: a run that does not recover is a finding).
        """
        out: dict[str, list[Sample]] = {v.key: [] for v in variants}
        repeat = repeat or self.profile.repeat
        total = len(variants) * repeat
        done = 0
        for rep in range(repeat):
            for variant in variants:
                done += 1
                sample = measure(variant, base, workers, self.profile.timeout_s,
                                 max_restarts, fault)
                status = "ok" if sample.ok else f"FAILED, {sample.error.split(': ...')[0]}"
                self.echo(f"  [{name}] {done}/{total} {variant.label}, {workers} workers, "
                          f"rep {rep + 1}: {status}")
                out[variant.key].append(sample)
                if not sample.ok:
                    self.failures.append(sample)
                    self.fatal_failures += not failures_are_results
        return out

    def main_runs(self) -> dict[str, list[Sample]]:
        """The runs behind figures 1, 2 and 5."""
        if self._main is None:
            self._main = self.run_set(
                "main", self.variants(*MAIN),
                self.profile.main, self.profile.workers)
        return self._main


def _summary(samples: list[Sample], get: Callable[[Sample], float | None]) -> Summary:
    """Summary over the successful runs."""
    return Summary.of([get(s) for s in samples if s.ok])


def _missing_row(table: Table, variant: Variant, runs: dict[str, list[Sample]]) -> bool:
    """Adds a placeholder row when ``variant`` was not run or no run of it succeeded."""
    if variant.key not in runs:
        why = NOT_AVAILABLE
    elif not any(s.ok for s in runs[variant.key]):
        why = "every run failed (see the failed-runs table)"
    else:
        return False
    table.add(variant.label, why, *["—"] * (len(table.headers) - 2))
    return True


def _others_cpu(samples: list[Sample]) -> str:
    """Median CPU (in cores) that other processes used during these runs."""
    return Summary.of([s.foreign_cores for s in samples]).fmt(2)


def cold_start(suite: Suite) -> list[Table]:
    """Figure 1: launch → first step on rank 0, launch → job end, and the phases."""
    runs = suite.main_runs()
    floor_first = _summary(runs[FLOOR.key], lambda s: s.cold_first_step_s)
    floor_end = _summary(runs[FLOOR.key], lambda s: s.cold_end_s)
    table = Table("Figure 1 — cold start (s, median (min–max))",
                  ["variant", "launch → first step", "ratio to (a), target",
                   "launch → job end", "ratio to (a)", "others' CPU (cores)"])
    for variant in MAIN:
        if _missing_row(table, variant, runs):
            continue
        first = _summary(runs[variant.key], lambda s: s.cold_first_step_s)
        end = _summary(runs[variant.key], lambda s: s.cold_end_s)
        target = with_target(ratio(first, floor_first), COLD_START_TARGET) \
            if variant is not FLOOR else "floor"
        table.add(variant.label, first.fmt(), target, end.fmt(),
                  fmt_ratio(ratio(end, floor_end)), _others_cpu(runs[variant.key]))
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
        table.add(name, *[_summary(runs[v.key], lambda s, n=name: s.phases.get(n)).fmt()
                          for v in variants])
    table.notes.append("From the workers' timestamps: process start (from /proc), imports done "
                       "(torchrun-style scripts only), process group joined / train function "
                       "entered, restore done, first step done. Under the Python API user code "
                       "starts after the session, so imports and process group are one phase.")
    return table


def steps(suite: Suite) -> list[Table]:
    """Figure 2: steady-state steps/s after the first epoch."""
    runs = suite.main_runs()
    floor = _summary(runs[FLOOR.key], lambda s: s.steps_per_s)
    saving = _summary(runs[TORCH_SAVE.key], lambda s: s.steps_per_s)
    table = Table("Figure 2 — steady-state steps/s (rank 0, after epoch 1)",
                  ["variant", "steps/s", "ratio to (a), target", "ratio to (b)",
                   "best run / (a)'s best run", "others' CPU (cores)"])
    targets = {ET_EPOCH.key: STEPS_EPOCH_TARGET, ET_STEP.key: STEPS_STEP_TARGET,
               ET_LAUNCH.key: STEPS_EPOCH_TARGET}
    for variant in MAIN:
        if _missing_row(table, variant, runs):
            continue
        value = _summary(runs[variant.key], lambda s: s.steps_per_s)
        r = ratio(value, floor)
        if variant is FLOOR:
            cell = "floor"
        elif variant.key in targets:
            cell = with_target(r, targets[variant.key])
        else:
            cell = fmt_ratio(r)
        best = value.best / floor.best if value.ok and floor.ok else None
        table.add(variant.label, value.fmt(2), cell, fmt_ratio(ratio(value, saving)),
                  fmt_ratio(best), _others_cpu(runs[variant.key]))
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
    size = _summary(runs[TORCH_SAVE.key] + runs[ET_EPOCH.key], lambda s: s.checkpoint_mb)
    table = Table(f"Figure 3 — time a {size.median:.0f} MiB checkpoint blocks rank 0 "
                  "(s, median (min–max) over every epoch of every run)",
                  ["variant", "torch.save", "report() blocks", "total blocked",
                   "ratio to plain torch.save", "others' CPU (cores)"])
    table.add(TORCH_SAVE.label + " (plain torch.save to local disk)", plain.fmt(3), "—",
              plain.fmt(3), "floor", _others_cpu(runs[TORCH_SAVE.key]))
    for key, label in ((ET_EPOCH.key, "(c) elastic-train, ASYNC (default)"),
                       ("sync", "(c) elastic-train, SYNC")):
        save = _pooled(runs[key], lambda s: s.save_s, scale=1.0)
        rep = _pooled(runs[key], lambda s: s.report_s, scale=1.0)
        total = _pooled(runs[key], lambda s: s.checkpoint_total_s, scale=1.0)
        table.add(label, save.fmt(3), rep.fmt(3), total.fmt(3), fmt_ratio(ratio(total, plain)),
                  _others_cpu(runs[key]))
    table.notes.append(f"State = model + SGD momentum + a {base.payload_mb} MiB payload tensor; "
                       f"{base.epochs} epochs × {base.steps_per_epoch} steps; storage is a "
                       "local temporary directory. Total blocked = torch.save + report() + "
                       "removing the temporary directory (for (b): torch.save + rename).")
    return [table]


def memory(suite: Suite) -> list[Table]:
    """Figure 5: peak RSS (VmHWM) of the agent/driver and of each worker."""
    runs = suite.main_runs()
    workers = suite.profile.workers
    floor = _summary(runs[FLOOR.key], lambda s: s.agent_rss_mb)
    table = Table("Figure 5 — peak memory, VmHWM (MiB, median (min–max))",
                  ["variant", "agent / driver process",
                   *[f"worker rank {r}" for r in range(workers)],
                   "other processes, summed", "agent − (a)'s agent, target",
                   "all processes, PSS", "PSS ratio to (a)"])
    floor_pss = _summary(runs[FLOOR.key], lambda s: s.pss_total_mb)
    for variant in MAIN:
        if _missing_row(table, variant, runs):
            continue
        samples = runs[variant.key]
        agent = _summary(samples, lambda s: s.agent_rss_mb)
        delta = agent.median - floor.median if agent.ok and floor.ok else None
        if variant is FLOOR:
            cell = "floor"
        elif delta is None:
            cell = "n/a"
        else:
            cell = (f"{delta:+.1f} MiB {AGENT_MEMORY_TARGET.describe()} "
                    f"{AGENT_MEMORY_TARGET.verdict(delta)}")
        pss = _summary(samples, lambda s: s.pss_total_mb)
        table.add(variant.label, agent.fmt(0),
                  *[_summary(samples, lambda s, r=r: s.worker_rss_mb.get(r)).fmt(0)
                    for r in range(workers)],
                  _summary(samples, lambda s: s.helper_rss_mb).fmt(0), cell, pss.fmt(0),
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
        a_first, c_first = (_summary(x, lambda s: s.cold_first_step_s) for x in (a, c))
        a_steps, c_steps = (_summary(x, lambda s: s.steps_per_s) for x in (a, c))
        table.add(workers, a_first.fmt(), c_first.fmt(), fmt_ratio(ratio(c_first, a_first)),
                  a_steps.fmt(), c_steps.fmt(), fmt_ratio(ratio(c_steps, a_steps)),
                  _others_cpu(a + c))
    cfg = profile.scaling
    table.notes += [
        f"Batch {cfg.batch} per worker (weak scaling); {cfg.epochs} epochs × "
        f"{cfg.steps_per_epoch} steps.",
        f"The machine has {os.cpu_count()} cores: 4 workers are oversubscribed, so both harnesses "
        "get exactly one torch thread per worker to keep the comparison fair.",
    ]
    return [table]


FIGURE_FUNCTIONS: dict[str, Callable[[Suite], list[Table]]] = {
    "cold_start": cold_start, "steps": steps, "checkpoint": checkpoint,
    "recovery": recovery, "memory": memory, "scaling": scaling, "storage": storage,
    "rendezvous": rendezvous, "rendezvous_scale": rendezvous_scale, "node_loss": node_loss,
    "shard_reads": shard_reads, "peer_restore": peer_restore, "local_tier": local_tier,
    "overhead": overhead, "straggler_cost": straggler_cost, "data_position": data_position,
    "nodes": nodes, "soak": soak, "gpu": gpu,
}


def failures_table(failures: list[Sample]) -> Table | None:
    """Runs that failed or timed out (left out of every figure), if any."""
    if not failures:
        return None
    table = Table("Failed runs (left out of the figures)", ["variant", "workers", "error"])
    for s in failures:
        head, _, tail = s.error.partition(": ...")
        tail = (head + ": ..." + " ".join(tail.split())[-300:]).replace("|", "\\|")
        table.add(s.variant, s.workers, tail)
    return table
