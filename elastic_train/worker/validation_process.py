"""The process one asynchronous validation runs in:
``python -m elastic_train.worker.validation_process RESULT_PATH OWNER_PID``.

Started by rank 0's :mod:`.validation_runner`, it reads the pickled validation
function, the committed checkpoint and the keyword arguments from stdin (so the
checkpoint's filesystem, credentials included, never touches a disk), calls
``fn(checkpoint, **fn_kwargs)`` and writes ``{"metrics": {...}}`` -- or
``{"error": traceback}`` -- to ``RESULT_PATH``, then kills whatever the function left
running (:func:`~elastic_train._internal.process_identity.end_started`). It dies with the worker
that started it, and so does every process it started
(:func:`~elastic_train.storage.parent_watch.die_with`): a validation nobody waits
for any more is not left running. Its own interpreter, so it holds no GIL the
training needs and touches no CUDA context of the worker's; it inherits the worker's
environment (devices, ``sys.path`` as ``PYTHONPATH``) and output (prefixed by rank 0).
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

import cloudpickle

from elastic_train._internal.metric_rows import AUTO_FIELDS, clean_metrics
from elastic_train._internal.process_identity import end_started
from elastic_train.storage import filesystem as fsutil
from elastic_train.storage.parent_watch import die_with

VALIDATION_PROCESS = "elastic_train.worker.validation_process"  # this module, as run


def validate(fn: Any, checkpoint: Any, fn_kwargs: dict[str, Any]) -> dict[str, Any]:
    """``fn(checkpoint, **fn_kwargs)`` as JSON metrics; Ray's ValueError when it returns
    anything but a dict, and one naming the fields the row fills in itself (overwriting
    ``training_iteration`` or ``checkpoint_dir_name`` would break resume)."""
    metrics = fn(checkpoint, **fn_kwargs)
    if not isinstance(metrics, dict):
        raise ValueError("The validation function must return a dictionary of metrics. "
                         f"Got {type(metrics)} instead.")
    if clash := sorted(set(map(str, metrics)) & set(AUTO_FIELDS)):
        raise ValueError(f"The validation function returned {clash}, which the metrics row "
                         "fills in itself: return them under other names.")
    return clean_metrics(metrics)


def main(argv: list[str]) -> int:
    result_path, owner_pid = argv[0], int(argv[1])
    die_with(owner_pid)
    try:
        payload = cloudpickle.loads(sys.stdin.buffer.read())
        result: dict[str, Any] = {"metrics": validate(payload["fn"], payload["checkpoint"],
                                                      payload["fn_kwargs"])}
    except BaseException:  # noqa: BLE001 - whatever the user's function raised is reported
        result = {"error": traceback.format_exc()}
    fsutil.write_local_json(result_path, result)
    end_started(os.getpid())  # what the function left running ends with it
    return 0 if "metrics" in result else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
