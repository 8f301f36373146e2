"""``Result``: what a run produced, read back from its run directory.

Mirrors ``ray.train.Result``. ``metrics_dataframe`` holds every reported row
(as Ray v1 does; Ray v2 keeps only rows of retained checkpoints).

Example::

    result = trainer.fit()
    print(result.metrics["loss"], result.checkpoint)
    df = Result.from_path("~/elastic_train_results/digits").metrics_dataframe
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import fsspec

from elastic_train.checkpoint import Checkpoint, committed_checkpoint
from elastic_train.config import CheckpointConfig
from elastic_train.errors import ConfigError, TrainingFailedError
from elastic_train.goodput.breakdown import Goodput, breakdown
from elastic_train.storage import RunStorage
from elastic_train.storage import filesystem as fsutil
from elastic_train.storage.retention import CheckpointRecord, ranked
from elastic_train.storage.run_state import RunStatus


@dataclass
class Result:
    """The outcome of a run.

    Attributes:
        metrics: The last row reported by rank 0, with auto-filled fields
            (``training_iteration``, ``timestamp``, ``time_total_s``, ...).
        checkpoint: The latest committed checkpoint; its ``get_commit_info()`` says
            which ranks wrote its files and its size (printed in its repr).
        error: The run's error when it failed.
        path: The run directory on ``filesystem``.
        filesystem: The fsspec filesystem of the run directory.
        best_checkpoints: ``[(Checkpoint, metrics)]`` of the ``num_to_keep`` best
            checkpoints by ``CheckpointConfig``'s score (all of them without
            ``num_to_keep``), oldest first. As Ray's: the latest checkpoint, which
            retention keeps so the run can resume, is listed only when it is among
            the best (it is always ``checkpoint``).
        return_value: What the train function returned on rank 0.
        goodput: Where the run's wall time went, by cause, per attempt and in total
            (our addition; :class:`~elastic_train.goodput.Goodput`, read from the run's
            goodput ledger): ``result.goodput.ettr``, ``result.goodput.seconds``.
    """

    metrics: dict[str, Any] | None
    checkpoint: Checkpoint | None
    error: Exception | None
    path: str
    filesystem: fsspec.AbstractFileSystem
    best_checkpoints: list[tuple[Checkpoint, dict[str, Any]]] = field(default_factory=list)
    return_value: Any = None
    metrics_history: list[dict[str, Any]] = field(default_factory=list, repr=False)
    goodput: Goodput | None = field(default=None, repr=False)

    @property
    def metrics_dataframe(self) -> Any:
        """Every reported row as a pandas DataFrame."""
        try:
            import pandas as pd
        except ImportError as exc:
            raise ImportError("Result.metrics_dataframe needs pandas: pip install pandas "
                              "(or elastic-train[pandas]).") from exc
        return pd.DataFrame(self.metrics_history)

    def get_best_checkpoint(self, metric: str, mode: str) -> Checkpoint | None:
        """The retained checkpoint with the best ``metric`` (``mode`` "max" or "min").

        As Ray's ``Result.get_best_checkpoint``; checkpoints that did not report
        the metric (or reported NaN) are skipped, and None is returned when none did.

        Example::

            best = result.get_best_checkpoint(metric="loss", mode="min")
        """
        if mode not in ("max", "min"):
            raise ValueError(f"get_best_checkpoint(mode={mode!r}): use 'max' or 'min'.")
        scored = [(m[metric], c) for c, m in self.best_checkpoints
                  if isinstance(m.get(metric), (int, float)) and not math.isnan(m[metric])]
        if not scored:
            return None
        pick = max if mode == "max" else min
        return pick(scored, key=lambda item: item[0])[1]

    @classmethod
    def from_storage(cls, storage: RunStorage, return_value: Any = None) -> Result:
        rows = storage.read_metrics()
        manifests = storage.checkpoints.committed()
        checkpoints = [(committed_checkpoint(storage.checkpoints.path(m.index), storage.fs, m),
                        m.metrics) for m in manifests]
        state = storage.read_run_state()
        best = _best(manifests, state.spec.get("checkpoint_config") if state else None)
        error = None
        if state is not None and state.status is RunStatus.FAILED:
            error = TrainingFailedError(state.error or "The run failed.",
                                        run_path=storage.display_path)
        return cls(
            metrics=rows[-1] if rows else None,
            checkpoint=checkpoints[-1][0] if checkpoints else None,
            error=error,
            path=storage.run_path,
            filesystem=storage.fs,
            best_checkpoints=[c for c, m in zip(checkpoints, manifests, strict=True)
                              if m.index in best],
            return_value=return_value,
            metrics_history=rows,
            goodput=breakdown(storage.read_ledger()),
        )

    @classmethod
    def from_path(cls, path: str | os.PathLike,
                  storage_filesystem: fsspec.AbstractFileSystem | None = None) -> Result:
        """Reads a run directory (local path or fsspec URL)."""
        fs, run_path = fsutil.resolve(os.fspath(path), storage_filesystem)
        storage = RunStorage(fs, run_path)
        if storage.read_run_state() is None:
            raise ConfigError(f"Result.from_path({os.fspath(path)!r}): no run.json there, so "
                              "it is not a run directory.")
        return cls.from_storage(storage)


def _best(manifests: list[Any], recorded: dict[str, Any] | None) -> set[int]:
    """The indices of the ``num_to_keep`` best committed checkpoints, ranked as retention
    ranks them, by the checkpoint settings ``run.json`` recorded (every index when it
    recorded none, or no ``num_to_keep``)."""
    indices = {m.index for m in manifests}
    if not recorded or recorded.get("num_to_keep") is None:
        return indices
    config = CheckpointConfig(**recorded)
    records = [CheckpointRecord(m.index, m.metrics) for m in manifests]
    return {r.index for r in ranked(records, config)[: config.num_to_keep]}
