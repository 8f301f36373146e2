"""What the tracking integrations share: flattening configs and picking metrics."""

from __future__ import annotations

import contextlib
import math
import shutil
import tempfile
from collections.abc import Collection, Iterator, Mapping
from typing import Any

from elastic_train._internal.metric_rows import NOT_METRICS
from elastic_train.callbacks import RunContext
from elastic_train.checkpoint import Checkpoint
from elastic_train.storage.run_state import RunStatus


def flatten(values: Mapping[str, Any], sep: str = "/", prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a/b": 1}``."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, sep, name + sep))
        else:
            flat[name] = value
    return flat


def metric_values(row: Mapping[str, Any], exclude: Collection[str] = NOT_METRICS
                  ) -> dict[str, float]:
    """The finite numbers of a reported row (nested dicts flattened), minus ``exclude``
    (by default the ids and clock readings among the fields we add, see
    :mod:`elastic_train._internal.metric_rows`)."""
    return {k: float(v) for k, v in flatten(row).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v) and k not in exclude}


def run_outcome(run_context: RunContext, failed: bool) -> str:
    """``finished``, ``failed`` or ``interrupted``, as the run ends (``after_run``)."""
    if failed:
        return "failed"
    try:
        state = run_context.storage.read_run_state()
    except Exception:
        state = None
    if state is not None and state.status in (RunStatus.FAILED, RunStatus.INTERRUPTED):
        return state.status.value
    return "finished"


@contextlib.contextmanager
def checkpoint_files(checkpoint: Checkpoint) -> Iterator[str]:
    """A temporary local copy of the checkpoint's own files (without our commit marker),
    for uploading to a tracker."""
    directory = tempfile.mkdtemp(prefix="elastic_train_artifact_")
    try:
        yield checkpoint.to_directory(directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
