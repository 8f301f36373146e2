"""A run at a glance, read from its directory: what ``elastic-train ls``/``show`` print."""

from __future__ import annotations

from dataclasses import dataclass

from elastic_train.config import CheckpointConfig
from elastic_train.errors import ConfigError
from elastic_train.storage import CommitManifest, RunStorage
from elastic_train.storage.checkpoint_store import dir_name
from elastic_train.storage.retention import CheckpointRecord, ranked


@dataclass
class RunSummary:
    """What ``ls`` and ``show`` tell of a run, read from its directory."""

    checkpoints: list[CommitManifest]
    best: CommitManifest | None
    score_attribute: str | None
    iterations: int
    deleted: list[str]

    @classmethod
    def read(cls, storage: RunStorage, state: dict) -> RunSummary:
        config = CheckpointConfig(**state.get("spec", {}).get("checkpoint_config", {}))
        checkpoints = storage.checkpoints.committed()
        try:
            best = ranked([CheckpointRecord(c.index, c.metrics) for c in checkpoints], config)
        except ConfigError:  # the score attribute was not reported: no ranking to show
            best = []
        by_index = {c.index: c for c in checkpoints}
        rows = storage.read_metrics()
        kept = {dir_name(c.index) for c in checkpoints}
        deleted = [r["checkpoint_dir_name"] for r in rows
                   if r.get("checkpoint_dir_name") and r["checkpoint_dir_name"] not in kept]
        return cls(checkpoints, by_index[best[0].index] if best else None,
                   config.checkpoint_score_attribute,
                   int(rows[-1].get("training_iteration", 0)) if rows else 0, deleted)

    def best_label(self) -> str:
        if self.best is None:
            return "-"
        if self.score_attribute:
            return f"{self.score_attribute}={self.best.metrics.get(self.score_attribute)}"
        return f"latest {dir_name(self.best.index)}"
