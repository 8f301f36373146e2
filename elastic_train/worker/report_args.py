"""``report()``'s arguments, checked on each rank before any rank waits for another.

Every argument of Ray 2.60's ``report()`` is accepted under its name; a value we
cannot honour raises a :class:`~elastic_train.errors.ConfigError` naming it and
the way out, before anything is staged or uploaded.

Example::

    args = ReportArgs.check({"loss": 0.5}, checkpoint, run_path="/results/run")
    args.metrics, args.mode, args.delete_local   # ({'loss': 0.5}, ASYNC, True)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from elastic_train.checkpoint import Checkpoint
from elastic_train.errors import ConfigError
from elastic_train.metric_rows import clean_metrics
from elastic_train.report_config import CheckpointUploadMode
from elastic_train.storage import filesystem as fsutil
from elastic_train.storage.checkpoint_names import check_dir_name


@dataclass(frozen=True)
class ReportArgs:
    """One ``report()``'s arguments, checked.

    Attributes:
        metrics: The metrics as JSON values.
        checkpoint: The local directory reported, or None.
        dir_name: The checkpoint directory's name asked for (None: the default).
        mode: When ``report()`` returns (see :class:`CheckpointUploadMode`).
        delete_local: Whether the checkpoint's local directory goes once uploaded.
    """

    metrics: dict[str, Any]
    checkpoint: Checkpoint | None
    dir_name: str | None
    mode: CheckpointUploadMode
    delete_local: bool

    @classmethod
    def check(cls, metrics: Any, checkpoint: Any = None, dir_name: str | None = None,
              mode: Any = CheckpointUploadMode.ASYNC, delete_local: bool | None = None,
              upload_fn: Callable[..., Any] | None = None, validation: Any = False,
              run_path: str | None = None) -> ReportArgs:
        """The arguments checked; ``run_path`` is the run directory when on local disk
        (a checkpoint directory holding it must not be deleted)."""
        clean = clean_metrics(metrics)
        if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
            raise ConfigError(f"report(checkpoint={checkpoint!r}) must be a Checkpoint.")
        if checkpoint is not None and not fsutil.is_local(checkpoint.filesystem):
            raise ConfigError(f"report(checkpoint={checkpoint!r}): pass a local directory, "
                              "Checkpoint.from_directory(path).")
        if dir_name is not None:
            check_dir_name(dir_name)
        try:
            mode = CheckpointUploadMode(mode)
        except ValueError:
            raise ConfigError(f"report(checkpoint_upload_mode={mode!r}): use one of "
                              f"{[m.name for m in CheckpointUploadMode]}, e.g. "
                              "CheckpointUploadMode.SYNC.") from None
        _refuse_unsupported(mode, upload_fn, validation, checkpoint)
        if delete_local is None:
            delete_local = mode.default_delete_local_checkpoint_after_upload()
        if delete_local and checkpoint is not None and run_path is not None:
            _refuse_deleting_the_run(checkpoint.path, run_path)
        return cls(clean, checkpoint, dir_name, mode, bool(delete_local))


def _refuse_unsupported(mode: CheckpointUploadMode, upload_fn: Any, validation: Any,
                        checkpoint: Any) -> None:
    if validation and checkpoint is None:
        raise ConfigError(f"report(validation={validation!r}) needs a checkpoint to "
                          "validate: pass checkpoint=... or drop validation.")
    if validation:
        raise ConfigError(
            f"report(validation={validation!r}) is not supported yet (asynchronous "
            "validation is to come): validate in the train function and report the "
            "metrics with the checkpoint, or validate Result.best_checkpoints after fit().")
    if upload_fn is not None:
        raise ConfigError(
            f"report(checkpoint_upload_fn={upload_fn!r}) is not supported yet: a checkpoint "
            "becomes visible only through the commit of the files the ranks stage. Drop "
            "the argument; the default upload writes to the run's storage_path.")
    if mode is CheckpointUploadMode.NO_UPLOAD:
        raise ConfigError(
            "report(checkpoint_upload_mode=NO_UPLOAD) is not supported: a checkpoint "
            "becomes visible only through the commit of the files the ranks report. Save "
            "the files into a local directory and report it (ASYNC, the default, uploads "
            "it without stalling training).")


def _refuse_deleting_the_run(checkpoint_path: str, run_path: str) -> None:
    """Ray's check: deleting a checkpoint directory that holds the run directory would
    delete the run."""
    ckpt, run = os.path.realpath(checkpoint_path), os.path.realpath(run_path)
    if os.path.commonpath([ckpt, run]) == ckpt:
        raise ConfigError(
            f"report(delete_local_checkpoint_after_upload=True) would delete "
            f"{checkpoint_path}, which holds the run directory {run_path}: write the "
            "checkpoint into a directory of its own (e.g. tempfile.mkdtemp()), or pass "
            "delete_local_checkpoint_after_upload=False.")
