"""One run of one variant, and the numbers derived from it.

:func:`measure` runs a variant in a fresh temporary directory (events,
checkpoints and elastic-train storage all live there and are deleted
afterwards) and turns the harness's launch/end times, the workers' events and
the sampled memory into a :class:`Sample`. With a :class:`FaultPlan` a rank
fails in the middle of an epoch (figure 4) and the recovery is timed from its
``fault`` event to the first step of the last rank to step again.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field

from bench import procs
from bench.events import Events
from bench.variants import REPO, Variant, base_env, command
from bench.workload import WorkloadConfig


@dataclass
class Sample:
    """Everything measured in one run (seconds, MiB); None where it does not apply."""

    variant: str
    workers: int
    ok: bool
    error: str = ""
    cold_first_step_s: float | None = None
    cold_end_s: float | None = None
    steps_per_s: float | None = None
    phases: dict[str, float] = field(default_factory=dict)
    agent_rss_mb: float | None = None
    worker_rss_mb: dict[int, float] = field(default_factory=dict)
    # Every other process of the tree (elastic-train's zygote and per-worker stand-ins,
    # Ray's worker actors' parents...), summed.
    helper_rss_mb: float = 0.0
    pss_total_mb: float | None = None  # peak of the tree's summed PSS
    save_s: list[float] = field(default_factory=list)
    report_s: list[float] = field(default_factory=list)
    checkpoint_total_s: list[float] = field(default_factory=list)  # save + report + cleanup
    step_report_s: list[float] = field(default_factory=list)  # mean per call, per epoch
    epoch_s: list[float] = field(default_factory=list)  # durations of epochs 2..N
    # Microseconds per steady-state step, mean over ranks: "wall", "thread_cpu", "process_cpu".
    step_us: dict[str, float] = field(default_factory=dict)
    checkpoint_mb: float | None = None
    recovery_s: float | None = None  # fault -> every rank's first step again
    recovery_phases: dict[str, float] = field(default_factory=dict)
    processes_started: int | None = None  # distinct worker processes (pids) over the run
    foreign_cores: float | None = None  # CPU other processes used during the run
    # The GPU figure (WorkloadConfig.probe): each attempt's start (device, memory) per rank,
    # and rank 0's final weights digest.
    attempts: list[dict] = field(default_factory=list)
    final_digest: str | None = None


@dataclass(frozen=True)
class FaultPlan:
    """The recovery figure's fault: rank ``rank`` fails ``how`` (``exception``, ``exit``,
    ``sigkill``, see :func:`bench.workload.fail`) after step ``step`` of epoch ``epoch``,
    in the first attempt; the run is given up if some rank has not stepped again
    ``recover_within_s`` after the fault."""

    how: str
    epoch: int = 1
    step: int = 5
    rank: int = 1
    recover_within_s: float = 30.0

    def apply(self, cfg: WorkloadConfig) -> WorkloadConfig:
        return cfg.replace(fault=self.how, fault_epoch=self.epoch, fault_step=self.step,
                           fault_rank=self.rank)


class Watchdog:
    """A poll callback: stops the run when, ``recover_within_s`` after the fault, some
    rank has not stepped again (a restart that hangs would otherwise hold the suite
    until the run's timeout)."""

    def __init__(self, events_dir: str, plan: FaultPlan, workers: int):
        self.events_dir = events_dir
        self.plan = plan
        self.workers = workers
        self.recovered = False

    def __call__(self, result: procs.RunResult) -> str | None:
        if self.recovered:
            return None
        events = Events.read(self.events_dir)
        fault = events.time_of("fault", rank=None)
        if fault is None or time.time() - fault < self.plan.recover_within_s:
            return None
        if every_rank_back(events, self.workers, fault) is not None:
            self.recovered = True
            return None
        return f"not every rank stepped again within {self.plan.recover_within_s:.0f} s"


def every_rank_back(events: Events, workers: int, fault: float) -> float | None:
    """When the last rank took its first step after ``fault`` (None: not all did).
    A restart's first step, whatever the rank's restart count (a node restarted for a
    membership change keeps its count)."""
    times = [min((e["t"] for e in events.select("first_step", rank=rank, restart=None)
                  if e["t"] > fault), default=None) for rank in range(workers)]
    return None if None in times else max(times)  # type: ignore[type-var]


_PHASES = (("agent: launch/detect → worker process start", "proc_start"),
           ("worker: imports", "imported"),
           ("worker: process group (+ elastic-train session)", "train_start"),
           ("worker: model, DDP, restore", "restored"),
           ("worker: first step", "first_step"))


def phase_order(name: str) -> int:
    """Sort key of a (possibly merged) phase name: its first phase's position."""
    first = name.split(" + ")[0]
    return next((i for i, (label, _) in enumerate(_PHASES) if label == first), len(_PHASES))


def _phases(ev: Events, origin: float, restart: int) -> dict[str, float]:
    """Rank 0's start-up split into phases, from ``origin`` (launch or kill) onwards.

    A phase whose closing event the variant does not write (``imported`` under
    elastic-train's API, where user code starts after the session) is merged into
    the next one, under both names.
    """
    out: dict[str, float] = {}
    previous = origin
    pending: list[str] = []
    for name, event in _PHASES:
        t = ev.time_of(event, rank=0, restart=restart)
        pending.append(name)
        if t is None or t < origin:  # not written, or (a process restarted in place)
            continue                 # started before the fault: merged into the next phase
        out[" + ".join(pending)] = t - previous
        previous, pending = t, []
    return out


def _epoch_durations(ev: Events, cfg: WorkloadConfig) -> list[float]:
    """Durations of epochs 2..N on rank 0, end to end (report/checkpoint included)."""
    ends = {e["epoch"]: e["t"] for e in ev.select("epoch_end")}
    return [ends[e] - ends[e - 1] for e in range(1, cfg.epochs) if e in ends and e - 1 in ends]


def _steady_steps_per_s(durations: list[float], cfg: WorkloadConfig) -> float | None:
    """Steps per epoch over the median epoch duration.

    The median, not the total, so that a burst of load from another process on the
    machine during one epoch does not decide the figure.
    """
    return cfg.steps_per_epoch / statistics.median(durations) if durations else None


def _step_costs(rows: list[dict]) -> dict[str, float]:
    """Per-step wall and CPU microseconds of the first attempt, averaged over the ranks."""
    rows = [r for r in rows if r["restart"] == 0 and r["steps"]]
    if not rows:
        return {}
    return {name: 1e6 * statistics.mean(r[f"{name}_s"] / r["steps"] for r in rows)
            for name in ("wall", "thread_cpu", "process_cpu")}


def _fill(sample: Sample, result: procs.RunResult, ev: Events, cfg: WorkloadConfig) -> None:
    sample.foreign_cores = result.foreign_cores
    first = ev.time_of("first_step")
    if first is not None:
        sample.cold_first_step_s = first - result.launched
        sample.phases = _phases(ev, result.launched, 0)
    if result.ok:
        sample.cold_end_s = result.ended - result.launched
    sample.epoch_s = _epoch_durations(ev, cfg)
    sample.steps_per_s = _steady_steps_per_s(sample.epoch_s, cfg)
    pids = ev.pids_by_rank()
    rank_of = {pid: rank for rank, ps in pids.items() for pid in ps}
    sample.agent_rss_mb = result.peak_rss_mb.get(result.root_pid)
    sample.pss_total_mb = result.peak_pss_total_mb or None
    for pid, rss in result.peak_rss_mb.items():
        if pid in rank_of:
            rank = rank_of[pid]
            sample.worker_rss_mb[rank] = max(rss, sample.worker_rss_mb.get(rank, 0.0))
        elif pid != result.root_pid:
            sample.helper_rss_mb += rss
    sample.save_s = [e["dt"] for e in ev.select("save")]
    sample.report_s = [e["dt"] for e in ev.select("report")]
    sample.checkpoint_total_s = [e["total"] for e in ev.select("report") if "total" in e] \
        or sample.save_s
    sample.step_report_s = [e["dt"] / e["n"] for e in ev.select("step_reports")]
    sample.step_us = _step_costs(ev.select("steady", rank=None))
    sizes = [e["bytes"] for e in ev.select("save") if "bytes" in e]
    sample.checkpoint_mb = sizes[0] / 2**20 if sizes else None
    sample.attempts = ev.select("attempt", rank=None, restart=None)
    final = ev.first("final", restart=None)
    sample.final_digest = final["digest"] if final else None
    fault = ev.time_of("fault", rank=None)
    back = every_rank_back(ev, sample.workers, fault) if fault is not None else None
    if fault is not None and back is not None:
        sample.recovery_s = back - fault
        sample.recovery_phases = _phases(ev, fault, 1)
        sample.processes_started = len({e["pid"] for e in ev.select("proc_start", rank=None,
                                                                     restart=None)})


def measure(variant: Variant, base: WorkloadConfig, workers: int, timeout_s: float,
            max_restarts: int = 0, fault: FaultPlan | None = None) -> Sample:
    """Runs ``variant`` once and returns its :class:`Sample` (``ok=False`` with the
    output's tail in ``error`` if it failed or timed out)."""
    workdir = tempfile.mkdtemp(prefix=f"bench_{variant.key}_")
    try:
        events_dir = os.path.join(workdir, "events")
        cfg = variant.workload(base).replace(events_dir=events_dir,
                                             ckpt_dir=os.path.join(workdir, "ckpt"))
        if fault is not None:
            cfg = fault.apply(cfg)
        os.makedirs(cfg.events_dir)
        os.makedirs(cfg.ckpt_dir)
        cmd = command(variant, cfg, workers, os.path.join(workdir, "storage"), max_restarts)
        watchdog = Watchdog(events_dir, fault, workers) if fault is not None else None
        result = procs.run(cmd, base_env(cfg.threads, variant), cwd=REPO, timeout_s=timeout_s,
                           log_path=os.path.join(workdir, "output.log"), on_poll=watchdog)
        sample = Sample(variant=variant.key, workers=workers, ok=result.ok)
        if not result.ok:
            fd, kept = tempfile.mkstemp(prefix=f"bench-failed-{variant.key}-", suffix=".log")
            os.close(fd)
            shutil.copyfile(os.path.join(workdir, "output.log"), kept)
            why = result.stopped or ("timed out" if result.timed_out
                                     else f"exit code {result.returncode}")
            sample.error = f"{why} (full output: {kept}): ...{result.output_tail[-1500:]}"
        _fill(sample, result, Events.read(events_dir), cfg)
        return sample
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

