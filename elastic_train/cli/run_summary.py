"""A run at a glance, read from its directory: what ``elastic-train ls``/``show`` print."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from elastic_train._internal.failure_kinds import FailureKind
from elastic_train.config import CheckpointConfig
from elastic_train.errors import ConfigError
from elastic_train.goodput.breakdown import Goodput, breakdown
from elastic_train.storage import CommitManifest, RunStorage
from elastic_train.storage.retention import CheckpointRecord, ranked
from elastic_train.storage.run_state import FailureRecord, RestoreRecord, RunState
from elastic_train.stragglers import STEP_FIELDS


@dataclass(frozen=True)
class Recovery:
    """How one failure was recovered from: seconds to detect it, to rendezvous again,
    to have the group ready (processes, process group, checkpoint chosen and
    verified), and the work redone. None where that step never happened."""

    kind: FailureKind
    detect_s: float
    rendezvous_s: float | None
    restore_s: float | None
    recomputed_iterations: int | None
    recomputed_s: float | None


@dataclass
class RunSummary:
    """What ``ls`` and ``show`` tell of a run, read from its directory."""

    checkpoints: list[CommitManifest]
    best: CommitManifest | None
    score_attribute: str | None
    iterations: int
    deleted: list[str]
    recoveries: list[Recovery] = field(default_factory=list)  # one per failure, in order
    train_s: float = 0.0
    wall_s: float = 0.0
    redone_s: float = 0.0
    step_times: dict[str, Any] = field(default_factory=dict)  # the latest row's STEP_FIELDS
    ledger: Goodput | None = None  # the run's wall time by cause (None: no ledger, older runs)
    damaged: str | None = None  # why the run's files could not be read (see unreadable)

    @property
    def goodput(self) -> float | None:
        """The ledger's ETTR (productive / wall time); for a run without a ledger (an
        older version's), training time kept in the result / wall-clock time of all
        launches."""
        if self.ledger is not None:
            return self.ledger.ettr
        return self.train_s / self.wall_s if self.wall_s > 0 else None

    @classmethod
    def read(cls, storage: RunStorage, state: RunState) -> RunSummary:
        config = CheckpointConfig(**state.spec.get("checkpoint_config", {}))
        checkpoints = storage.checkpoints.committed()
        try:
            best = ranked([CheckpointRecord(c.index, c.metrics) for c in checkpoints], config)
        except ConfigError:  # the score attribute was not reported: no ranking to show
            best = []
        by_index = {c.index: c for c in checkpoints}
        rows = storage.read_metrics()
        kept = {c.name for c in checkpoints}
        deleted = [r["checkpoint_dir_name"] for r in rows
                   if r.get("checkpoint_dir_name") and r["checkpoint_dir_name"] not in kept]
        restores = storage.read_restores()
        now = time.time()
        wall = sum((launch.ended or state.updated or now) - launch.started
                   for launch in state.launches if launch.started)
        return cls(checkpoints, by_index[best[0].index] if best else None,
                   config.checkpoint_score_attribute,
                   int(rows[-1].get("training_iteration", 0)) if rows else 0, deleted,
                   recoveries=recoveries(state.failures, restores),
                   train_s=float(rows[-1].get("time_total_s", 0.0)) if rows else 0.0,
                   wall_s=wall, redone_s=sum(r.recomputed_s for r in restores),
                   step_times={k: rows[-1][k] for k in STEP_FIELDS if rows and k in rows[-1]},
                   ledger=ledger if (ledger := breakdown(storage.read_ledger())).wall_s else None)

    @classmethod
    def unreadable(cls, why: str) -> RunSummary:
        """The summary of a run whose files (beside its run.json) cannot be read: ``ls``
        lists it as damaged, saying ``why``, and shows the other runs."""
        return cls([], None, None, 0, [], damaged=why)

    def best_label(self) -> str:
        if self.best is None:
            return "-"
        if self.score_attribute:
            return f"{self.score_attribute}={self.best.metrics.get(self.score_attribute)}"
        return f"latest {self.best.name}"


def recoveries(failures: list[FailureRecord], restores: list[RestoreRecord]) -> list[Recovery]:
    """One :class:`Recovery` per failure.

    A restart is matched with the first ``restores.json`` entry after its failure;
    entries without a failure are resumed launches (after a driver's death).
    """
    out, pending = [], list(restores)
    for failure in failures:
        rendezvous = failure.rendezvous_at
        while pending and pending[0].time < failure.time:
            pending.pop(0)
        restore = pending.pop(0) if pending and rendezvous else None
        out.append(Recovery(
            kind=failure.kind, detect_s=failure.time - failure.failed_at,
            rendezvous_s=rendezvous - failure.time if rendezvous else None,
            restore_s=restore.time - rendezvous if restore and rendezvous else None,
            recomputed_iterations=restore.recomputed_iterations if restore else None,
            recomputed_s=restore.recomputed_s if restore else None))
    return out
