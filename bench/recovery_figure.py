"""Figure 4, the crash figure: a worker fails mid-epoch -> every rank's first step again.

Each fault of the profile (``exception``: the train function raises -- under
torchrun its process exits 1; ``exit``: the process exits with code 1;
``sigkill``: it is killed) hits rank 1 after a few steps of epoch 2, in the
first attempt only, right after a ``fault`` event. The figure times, per
variant, from that event to the first step of the *last* rank to step again
after the restart, and counts the worker processes the run started in all.

(a') torchrun's restarts (every worker a new process, with a store prefix per
restart so that they work) are the floor; (c) elastic-train's ``fit()``
restarts in process by default, (c-proc) with new processes forked from its
warm zygote; (d) a launched script keeps torchrun's restarts, (d') one whose
main is wrapped by ``@elastic_train.restart_in_process`` restarts in process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from bench.measure import Sample, phase_order
from bench.report import Table
from bench.stats import Summary, Target, fmt_ratio, ratio, with_target
from bench.variants import (
    ET_EPOCH,
    ET_LAUNCH,
    ET_LAUNCH_INPROC,
    ET_NO_STANDBY,
    ET_PROC,
    FLOOR_NS,
    RAY,
)

if TYPE_CHECKING:
    from bench.suite import Suite

RECOVERY_TARGET = Target(1.0, at_least=False)  # seconds, elastic-train's in-process rows
VARIANTS = (FLOOR_NS, ET_EPOCH, ET_NO_STANDBY, ET_PROC, ET_LAUNCH, ET_LAUNCH_INPROC, RAY)
IN_PROCESS = (ET_EPOCH.key, ET_NO_STANDBY.key, ET_LAUNCH_INPROC.key)
FAULT_NAMES = {"exception": "exception in the train function",
               "exit": "worker exits (code 1)", "sigkill": "worker SIGKILLed"}


def _over_all(samples: list[Sample], get: Callable[[Sample], float | None]) -> Summary:
    return Summary.of([get(s) for s in samples])  # failed runs too: they have a cold start


def recovery(suite: Suite) -> list[Table]:
    """Figure 4 and 4b."""
    profile = suite.profile
    table = Table("Figure 4 — a worker fails mid-epoch: fault → every rank's first step again "
                  "(s, median (min–max))",
                  ["fault", "variant", "recovered", "fault → every rank stepping again",
                   "target", "ratio to (a')", "worker processes started", "others' CPU"])
    split = Table("Figure 4b — where the recovery goes (rank 0, s, median), "
                  f"{FAULT_NAMES[profile.faults[-1]]}", ["phase"])
    for how in profile.faults:
        fault = replace(profile.fault, how=how)
        runs = suite.run_set(f"recovery/{how}", suite.variants(*VARIANTS), profile.recovery,
                             profile.workers, max_restarts=1, fault=fault,
                             failures_are_results=True)
        floor = _over_all(runs[FLOOR_NS.key], lambda s: s.recovery_s)
        for variant in VARIANTS:
            if variant.key not in runs:
                continue
            samples = runs[variant.key]
            rec = _over_all(samples, lambda s: s.recovery_s)
            recovered = sum(s.recovery_s is not None for s in samples)
            table.add(FAULT_NAMES[how], variant.label, f"{recovered}/{len(samples)}",
                      rec.fmt(), with_target(rec.median if rec.ok else None, RECOVERY_TARGET)
                      if variant.key in IN_PROCESS else "",
                      fmt_ratio(ratio(rec, floor)) if variant is not FLOOR_NS else "floor",
                      _over_all(samples, lambda s: s.processes_started).fmt(0),
                      Summary.of([s.foreign_cores for s in samples]).fmt(2))
        if how == profile.faults[-1]:
            _phases_into(split, runs)
    table.notes += _notes(suite)
    split.notes.append("From the fault onwards: agent detection and restart, the rank's "
                       "process (a new one, or the same one again), process group and "
                       "session, model and restore, first step. A phase whose start came "
                       "before the fault (a process restarted in place) is merged into the "
                       "next one.")
    return [table, split]


def _phases_into(split: Table, runs: dict[str, list[Sample]]) -> None:
    keys = [v.key for v in VARIANTS if v.key in runs]
    split.headers += [v.label for v in VARIANTS if v.key in runs]
    names = sorted({n for key in keys for s in runs[key] for n in s.recovery_phases},
                   key=lambda n: (phase_order(n), n))
    for name in names:
        split.add(name, *[_over_all(runs[key], lambda s, n=name: s.recovery_phases.get(n))
                          .fmt() for key in keys])


def _notes(suite: Suite) -> list[str]:
    fault, cfg = suite.profile.fault, suite.profile.recovery
    return [
        f"{suite.profile.workers} workers; rank {fault.rank} fails after step {fault.step + 1} "
        f"of epoch {fault.epoch + 1} ({cfg.steps_per_epoch} steps per epoch, a checkpoint at "
        "the end of each), first attempt only; --max-restarts 1 / FailureConfig(max_failures=1).",
        "Timed from the failing worker's own 'fault' stamp to the first step of the last rank "
        "to step again; every variant resumes from its last checkpoint except (a'), which "
        "starts over. The target (≤ 1.0 s) applies to elastic-train's in-process rows.",
        "(a') is torchrun joining its process group under a per-restart store prefix: bare "
        "torchrun's restarted gloo group reads the dead group's addresses from the store it "
        "keeps across restarts ('Gloo connectFullMesh failed ... Connection refused'), so "
        "its restarts rarely work without it.",
        "Worker processes started: distinct worker pids over the whole run (2 = no new "
        "process; an in-process restart after a death adds one).",
        f"A run counts as not recovered if some rank has not stepped again "
        f"{fault.recover_within_s:.0f} s after the fault, or the job fails.",
    ]
