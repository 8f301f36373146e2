"""Figure 17: a checkpoint interval that tunes itself loses less time on the same faults,
and live recovery loses almost none.

Runs :mod:`bench.interval_job`: three 2-rank ``fit()`` runs in one process, with the same
steps, save cost and faults by the clock (rank 1 raises at the same seeded, exponentially
spaced times after each ``fit()`` began), checkpointing every step, every epoch, or when
``elastic_train.should_checkpoint()`` says (Young/Daly from the save cost it measured
and the failures it saw; told the faults' mean period as its prior), or every epoch with
its state kept live (``LiveState``: a fault rolls back one step at most). Each run's
goodput ledger says where its time went. Goals: the ``should_checkpoint()`` run takes
less wall time than the every-step and every-epoch runs, and its two ranks got the same
answer every time; the live run's ETTR is at least 90 % and a fault costs it at most
0.5 s from the fault to the next completed step.

Run: ``python -m bench --only interval`` (``--smoke``: the ``should_checkpoint()`` run
alone, short, with one fault: it proves the paths run, not the ordering).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from bench import procs
from bench.report import Table
from bench.variants import REPO, base_env

if TYPE_CHECKING:
    from bench.suite import Suite

POLICIES = ("step", "epoch", "should_checkpoint", "live")
LIVE_ETTR, LIVE_FAULT_TO_STEP_S = 0.90, 0.5  # the live run's goals


@dataclass(frozen=True)
class IntervalWorkload:
    """The job of figure 17: ``steps`` of ``step_s``, a save of ``save_s``, a fault every
    ``fault_every_s`` of wall time."""

    steps: int = 300
    steps_per_epoch: int = 100
    step_s: float = 0.1
    save_s: float = 0.2
    fault_every_s: float = 10.0  # the mean of the exponential gaps between faults
    min_gap_s: float = 3.0  # ... never shorter: a restart here takes ~2 s
    fault_seed: int = 0
    timeout_s: float = 900.0  # the three runs
    policies: tuple[str, ...] = POLICIES  # (smoke: should_checkpoint() alone)


def interval(suite: Suite) -> list[Table]:
    workload = suite.profile.interval
    table = Table("Figure 17 — checkpoint interval on the same faults (2 ranks; wall time by "
                  "cause from each run's goodput ledger)",
                  ["checkpoint policy (checkpoints)", "wall, s", "ETTR", "saves, s",
                   "recompute, s", "faults", "start-up, restarts, shutdown, s", "goal"])
    walls = {}
    runs = _run(suite, workload) or {}
    for policy in workload.policies:
        data = runs.get(policy)
        if data is None or not data["finished"]:
            suite.fatal_failures += 1
            table.add(policy, "failed", "", "", "", "", "", "")
            continue
        goodput = data["goodput"]
        seconds = goodput["seconds"]
        walls[policy] = goodput["wall_s"]
        restarts = sum(seconds[c] for c in ("startup", "detection", "rendezvous", "restore",
                                            "stragglers", "shutdown", "other"))
        agree = data["answers_agree"]
        table.add(f"{policy} ({goodput['checkpoints']})", f"{goodput['wall_s']:.1f}",
                  f"{goodput['ettr']:.1%}", f"{seconds['checkpoint']:.1f}",
                  f"{seconds['recompute']:.1f}", goodput["failures"], f"{restarts:.1f}",
                  "" if agree is None else f"same answer on both ranks: "
                  f"{'PASS' if agree else 'FAIL'}")
    if {"step", "epoch", "should_checkpoint"} <= walls.keys():
        best = walls["should_checkpoint"] < min(walls["step"], walls["epoch"])
        table.notes.append(f"should_checkpoint() took less wall time than every step and "
                           f"every epoch: {'PASS' if best else 'MISS'}.")
    if "live" in walls:
        table.notes.append(_live_note(runs["live"]))
    table.notes.append(f"{workload.steps} steps of {workload.step_s} s (sleep), "
                       f"{workload.steps_per_epoch} an epoch; a save is torch.save + "
                       f"{workload.save_s} s, SYNC; rank 1 raises at the same times in each "
                       f"run (seed {workload.fault_seed}: exponential gaps of mean "
                       f"{workload.fault_every_s} s, at least {workload.min_gap_s} s; "
                       "in-process restarts). Young/Daly: sqrt(2 * C * MTBF), C measured by "
                       "the job, MTBF observed (the faults' mean period as its prior). "
                       "A longer run meets more of the schedule's faults. Saves: the "
                       "ledger's checkpoint time, which for every step and every epoch is "
                       "report()'s wait alone (their torch.save and sleep before report() "
                       "count as productive: the ledger sees a user's own save only after "
                       "should_checkpoint()'s True); wall time is what they all cost.")
    return [table]


def _live_note(data: dict) -> str:
    """The live run's goals: its ETTR, and each fault to the next completed step."""
    ettr, gaps = data["goodput"]["ettr"] or 0.0, sorted(data["fault_to_step_s"])
    said = (f"live: ETTR {ettr:.1%} (goal >= {LIVE_ETTR:.0%}: "
            f"{'PASS' if ettr >= LIVE_ETTR else 'MISS'}), "
            f"{data['goodput']['live_recoveries']} of {data['goodput']['failures']} "
            "recoveries from memory")
    if gaps:
        median = gaps[len(gaps) // 2]
        said += (f"; fault -> next completed step {median:.2f} s median ({gaps[0]:.2f}-"
                 f"{gaps[-1]:.2f}; goal <= {LIVE_FAULT_TO_STEP_S} s: "
                 f"{'PASS' if median <= LIVE_FAULT_TO_STEP_S else 'MISS'})")
    return said + "."


def _run(suite: Suite, workload: IntervalWorkload) -> dict | None:
    """Every policy's outcome, by policy (None: the job wrote nothing)."""
    work = tempfile.mkdtemp(prefix="bench-interval-")
    try:
        config = {**asdict(workload), "work": work,
                  "storage": os.path.join(work, "storage")}
        config_path, out = os.path.join(work, "config.json"), os.path.join(work, "out.json")
        with open(config_path, "w") as f:
            json.dump(config, f)
        result = procs.run([sys.executable, "-m", "bench.interval_job", config_path, out],
                           base_env(1), cwd=REPO, timeout_s=workload.timeout_s,
                           log_path=os.path.join(work, "log"), memory=False)
        suite.echo(f"  [interval] {'ok' if result.ok else 'FAILED'} in "
                   f"{result.ended - result.launched:.0f} s")
        if not os.path.exists(out):
            suite.echo(result.output_tail[-600:])
            return None
        with open(out) as f:
            return json.load(f)
    finally:
        shutil.rmtree(work, ignore_errors=True)
