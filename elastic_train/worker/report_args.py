"""``report()``'s arguments, checked on each rank before any rank waits for another.

Every argument of Ray 2.60's ``report()`` is accepted under its name; a value we
cannot honour raises a :class:`~elastic_train.errors.ConfigError` naming it and
the way out, before anything is staged or uploaded.

Example::

    args = ReportArgs.check({"loss": 0.5}, checkpoint, run=(fs, "/results/run"))
    args.metrics, args.mode, args.delete_local   # ({'loss': 0.5}, ASYNC, False)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fsspec

from elastic_train._internal.metric_rows import AUTO_FIELDS, clean_metrics
from elastic_train.checkpoint import Checkpoint
from elastic_train.errors import ConfigError
from elastic_train.report_config import CheckpointUploadMode
from elastic_train.storage import filesystem as fsutil
from elastic_train.storage.checkpoint_names import check_dir_name
from elastic_train.validation_config import ValidationTaskConfig, check_validation

logger = logging.getLogger(__name__)


_warned: set[str] = set()  # the automatic fields this process has warned of


def _warn_of_automatic_fields(metrics: dict[str, Any]) -> None:
    """A metric named as a field report() fills in itself (``training_iteration``) is
    replaced in the row, as Ray's is: said once per field and process, so that a run
    ported from a loop that counted its own iterations does not lose them unnoticed."""
    for key in sorted(metrics.keys() & AUTO_FIELDS.keys() - _warned):
        _warned.add(key)
        logger.warning("report(): %r is a field elastic-train fills in itself (%s): the "
                       "value reported, %r, is replaced. Report it under another name, "
                       "e.g. %r.", key, AUTO_FIELDS[key], metrics[key], f"my_{key}")


@dataclass(frozen=True)
class ReportArgs:
    """One ``report()``'s arguments, checked.

    Attributes:
        metrics: The metrics as JSON values.
        checkpoint: The local directory reported, or None.
        dir_name: The checkpoint directory's name asked for (None: the default); with
            ``NO_UPLOAD``, or a ``checkpoint_upload_fn`` given a directory of the run,
            the name of the run's directory the checkpoint is.
        mode: When ``report()`` returns (see :class:`CheckpointUploadMode`).
        delete_local: Whether the checkpoint's local directory goes once uploaded.
        upload_fn: ``checkpoint_upload_fn``: writes the checkpoint into the run
            directory itself (None: the default upload).
        in_run: The checkpoint reported with ``upload_fn`` is a directory of the run
            (files the function finishes writing there, e.g. with ``dcp.async_save``).
        validation: ``validation``: False, True (the trainer's ``ValidationConfig``
            defaults) or a ``ValidationTaskConfig``.
    """

    metrics: dict[str, Any]
    checkpoint: Checkpoint | None
    dir_name: str | None
    mode: CheckpointUploadMode
    delete_local: bool
    upload_fn: Callable[[Checkpoint, str], Checkpoint] | None = None
    validation: bool | ValidationTaskConfig = False
    in_run: bool = False

    @property
    def in_place(self) -> bool:
        """A ``NO_UPLOAD`` checkpoint: its files are in the run directory already."""
        return self.checkpoint is not None and self.mode is CheckpointUploadMode.NO_UPLOAD

    @classmethod
    def check(cls, metrics: Any, checkpoint: Any = None, dir_name: str | None = None,
              mode: Any = None, delete_local: bool | None = None,
              upload_fn: Callable[..., Any] | None = None, validation: Any = False,
              run: tuple[fsspec.AbstractFileSystem, str] | None = None,
              has_validation_fn: bool = False) -> ReportArgs:
        """The arguments checked; ``run`` is the run directory's filesystem and path
        (a ``NO_UPLOAD`` checkpoint must be one of its directories; a checkpoint
        directory holding it must not be deleted); ``has_validation_fn``: whether the
        trainer has a ``validation_config``. ``mode`` None is our default, ASYNC,
        which deletes nothing unless asked: Ray's default deletion applies to an ASYNC
        asked for (Ray's default mode, SYNC, never deletes)."""
        explicit = mode is not None
        mode = CheckpointUploadMode.ASYNC if mode is None else mode
        clean = clean_metrics(metrics)
        _warn_of_automatic_fields(clean)
        if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
            raise ConfigError(f"report(checkpoint={checkpoint!r}) must be a Checkpoint.")
        try:
            mode = CheckpointUploadMode(mode)
        except ValueError:
            raise ConfigError(f"report(checkpoint_upload_mode={mode!r}): use one of "
                              f"{[m.name for m in CheckpointUploadMode]}, e.g. "
                              "CheckpointUploadMode.SYNC.") from None
        validation = _check_validation(validation, checkpoint, has_validation_fn)
        in_run = False
        if upload_fn is not None:
            _check_upload_fn(upload_fn, mode, checkpoint)
            if checkpoint is not None and (name := _name_in_run(checkpoint, run)):
                dir_name, in_run = _named_by_directory(name, checkpoint, dir_name,
                                                       delete_local, "checkpoint_upload_fn"), True
                delete_local = False
        if mode is CheckpointUploadMode.NO_UPLOAD and checkpoint is not None:
            dir_name = _run_directory(checkpoint, dir_name, delete_local, run)
        elif checkpoint is not None and upload_fn is None \
                and not fsutil.is_local(checkpoint.filesystem):
            raise ConfigError(f"report(checkpoint={checkpoint!r}): pass a local directory, "
                              "Checkpoint.from_directory(path) (or, for files written into "
                              "the run directory already, checkpoint_upload_mode=NO_UPLOAD).")
        if dir_name is not None:
            check_dir_name(dir_name)
        if delete_local is None:
            delete_local = explicit and mode.default_delete_local_checkpoint_after_upload()
        if delete_local and checkpoint is not None and run and fsutil.is_local(run[0]):
            _refuse_deleting_the_run(checkpoint.path, run[1])
        return cls(clean, checkpoint, dir_name, mode, bool(delete_local), upload_fn,
                   validation, in_run)


def _name_in_run(checkpoint: Checkpoint, run: tuple[fsspec.AbstractFileSystem, str] | None
                 ) -> str | None:
    """The name of the run's directory ``checkpoint`` is, or None when it is not one."""
    path = checkpoint.path.rstrip("/")
    parent, _, name = path.rpartition("/")
    inside = run is not None and fsutil.same_store(checkpoint.filesystem, run[0]) and (
        os.path.realpath(parent) == os.path.realpath(run[1]) if fsutil.is_local(run[0])
        else parent == run[1].rstrip("/"))
    return name if inside else None


def _named_by_directory(name: str, checkpoint: Checkpoint, dir_name: str | None,
                        delete_local: bool | None, how: str) -> str:
    """``name``, the run's directory a checkpoint reported ``how`` (NO_UPLOAD, or with a
    checkpoint_upload_fn) is, which names it; a ConfigError when another name is asked
    for, or when asked to delete the directory (it is the checkpoint)."""
    if dir_name is not None and dir_name != name:
        raise ConfigError(f"report(checkpoint_dir_name={dir_name!r}, {how}): the "
                          f"checkpoint is the directory {name!r}; drop the argument or pass "
                          "that name.")
    if delete_local:
        raise ConfigError(f"report(delete_local_checkpoint_after_upload=True, {how}) would "
                          f"delete the checkpoint {checkpoint.path} itself: drop the argument.")
    return name


def _run_directory(checkpoint: Checkpoint, dir_name: str | None, delete_local: bool | None,
                   run: tuple[fsspec.AbstractFileSystem, str] | None) -> str:
    """The name of the run's directory a ``NO_UPLOAD`` checkpoint is; a ConfigError with
    the way out when it is anywhere else (Ray's rule: the run manages only what is
    inside it), is missing, or when asked to delete it (it is the checkpoint)."""
    name = _name_in_run(checkpoint, run)
    if name is None:
        where = run[1] if run is not None else "the run directory"
        raise ConfigError(
            f"report(checkpoint={checkpoint!r}, checkpoint_upload_mode=NO_UPLOAD): the "
            f"checkpoint is not a directory of the run {where}. Write the files into "
            f"{where}/<name> (get_context().get_storage().experiment_fs_path) and report "
            "that directory, or report a local directory without NO_UPLOAD.")
    _named_by_directory(name, checkpoint, dir_name, delete_local, "NO_UPLOAD")
    if checkpoint.written is not None:
        raise ConfigError(f"report(checkpoint={checkpoint!r}, NO_UPLOAD): the files must be "
                          "written before report(); wait for the future first.")
    if not checkpoint.filesystem.isdir(checkpoint.path):
        raise ConfigError(f"report(checkpoint={checkpoint!r}, NO_UPLOAD): there is no such "
                          "directory; write the checkpoint's files there before report().")
    return name


def _check_upload_fn(upload_fn: Any, mode: CheckpointUploadMode, checkpoint: Any) -> None:
    if not callable(upload_fn):
        raise ConfigError(f"report(checkpoint_upload_fn={upload_fn!r}) must be a function "
                          "(checkpoint, dir_name) -> Checkpoint.")
    if mode is CheckpointUploadMode.NO_UPLOAD:
        raise ConfigError("report(checkpoint_upload_fn=..., NO_UPLOAD): NO_UPLOAD uploads "
                          "nothing, so there is nothing for the function to do; drop one.")
    if checkpoint is not None and checkpoint.written is not None:
        raise ConfigError(f"report(checkpoint={checkpoint!r}, checkpoint_upload_fn=...): the "
                          "files must be written before report(); wait for the future first.")


def _check_validation(validation: Any, checkpoint: Any, has_validation_fn: bool
                      ) -> bool | ValidationTaskConfig:
    """Ray's checks of ``report(validation=...)``: a checkpoint to validate, and a
    trainer that has a function to validate it with."""
    validation = check_validation(validation)
    if validation and checkpoint is None:
        raise ConfigError(f"report(validation={validation!r}) needs a checkpoint to "
                          "validate: pass checkpoint=... or drop validation.")
    if validation and not has_validation_fn:
        raise ConfigError(
            f"report(validation={validation!r}): `validation_config` was not set on the "
            "trainer, but a validation was requested. Pass TorchTrainer(..., "
            "validation_config=ValidationConfig(fn)), or drop validation.")
    return validation


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
