"""A metric row: what one ``report()`` of rank 0 records in ``metrics.jsonl``.

A row is the user's metrics plus the fields elastic-train adds to it,
:data:`AUTO_FIELDS` (Ray Train's names). The worker session writes rows
(:class:`ReportRows`); the driver's progress line, ``elastic-train show``, the
callbacks and ``Result`` read them, and tell the two kinds apart with the helpers
here. Imports neither torch nor numpy: ``elastic-train ls``/``show`` import it.

Example::

    rows = ReportRows()
    row = rows.next(clean_metrics({"loss": 0.25}))
    user_metrics(row)  # {"loss": 0.25}
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from elastic_train.errors import ConfigError
from elastic_train.stragglers import STEP_FIELDS

# Every field the project adds to a row, and what it holds.
AUTO_FIELDS: dict[str, str] = {
    "training_iteration": "reports so far, counted on across restarts (the first is 1)",
    "timestamp": "when the report was made, whole seconds since the epoch",
    "date": "the same in local time, YYYY-mm-dd_HH-MM-SS",
    "time_this_iter_s": "seconds since this attempt's previous report (or its start)",
    "time_total_s": "seconds of training the run kept: the restored history's and this "
                    "attempt's",
    "time_since_restore": "seconds since this attempt's session started",
    "iterations_since_restore": "reports since this attempt's session started",
    "hostname": "rank 0's host",
    "pid": "rank 0's process id",
    "checkpoint_dir_name": "the checkpoint reported with the row (rows with one only)",
    **STEP_FIELDS,  # the step times and straggler scores (see elastic_train.stragglers)
}
# The numbers among them that are ids or clock readings, not metrics of the training.
NOT_METRICS = frozenset({"timestamp", "pid", "slowest_rank", "slowest_node"})
# What a chart of the run does not plot: those, and its step, training_iteration.
NOT_PLOTTED = NOT_METRICS | {"training_iteration"}


def user_metrics(row: dict[str, Any]) -> dict[str, Any]:
    """The metrics the user reported: ``row`` without :data:`AUTO_FIELDS`."""
    return {k: v for k, v in row.items() if k not in AUTO_FIELDS}


def numeric_items(row: dict[str, Any]) -> dict[str, float]:
    """The row's numbers (not booleans), as floats."""
    return {k: float(v) for k, v in row.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def plotted(row: dict[str, Any]) -> dict[str, float]:
    """The numbers worth a chart: :func:`numeric_items` without :data:`NOT_PLOTTED`."""
    return {k: v for k, v in numeric_items(row).items() if k not in NOT_PLOTTED}


def _single_number(value: Any) -> bool:
    """A one-element tensor or array, or a numpy scalar (all have ``item()``)."""
    numel = getattr(value, "numel", None)  # torch tensors; numpy has an int ``size``
    count = numel() if callable(numel) else getattr(value, "size", None)
    return hasattr(value, "item") and count == 1


def jsonable(value: Any, key: str) -> Any:
    """Plain JSON values; one-element tensors and numpy scalars become numbers. NaN and
    ±inf stay floats, as Ray keeps them: Python's ``json`` writes them as ``NaN`` and
    ``Infinity`` and reads them back as floats."""
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    if _single_number(value):
        return jsonable(value.item(), key)
    if isinstance(value, (list, tuple)):
        return [jsonable(v, key) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v, f"{key}.{k}") for k, v in value.items()}
    raise ConfigError(
        f"report(): metric {key!r} has a value of type {type(value).__name__} ({value!r:.80}), "
        "which cannot be stored as JSON: report numbers, strings or lists of them."
    )


def clean_metrics(metrics: Any) -> dict[str, Any]:
    """``report()``'s ``metrics`` as JSON values, or a ConfigError naming the bad one."""
    if not isinstance(metrics, dict):
        raise ConfigError(f"report(metrics={metrics!r}): metrics must be a dict.")
    return {str(k): jsonable(v, str(k)) for k, v in metrics.items()}


class ReportRows:
    """Numbers one attempt's reports and fills in their :data:`AUTO_FIELDS`.

    A resumed attempt starts at the restored checkpoint's ``iteration`` and
    ``time_before_restore_s`` (its history's ``time_total_s``), so that a run's
    counters go on across restarts; ``start`` is when the attempt's session began.
    """

    def __init__(self, iteration: int = 0, time_before_restore_s: float = 0.0,
                 start: float | None = None):
        self.iteration = iteration
        self._iterations_at_start = iteration
        self._time_before_restore_s = time_before_restore_s
        self._start = time.time() if start is None else start
        self._last_report = self._start

    def resume_at(self, iteration: int) -> None:
        """The attempt goes on from a live state at report ``iteration`` (not the
        checkpoint's): the next report is ``iteration + 1``."""
        self.iteration = self._iterations_at_start = iteration

    @property
    def since_start(self) -> int:
        """The reports of this attempt so far."""
        return self.iteration - self._iterations_at_start

    def next(self, metrics: dict[str, Any], now: float | None = None) -> dict[str, Any]:
        """The row of the next report: ``metrics`` (already clean) and the automatic fields
        (``checkpoint_dir_name`` is the caller's, as only it knows of a checkpoint)."""
        now = time.time() if now is None else now
        self.iteration += 1
        row = {
            **metrics,
            "training_iteration": self.iteration,
            "timestamp": int(now),
            "date": time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(now)),
            "time_this_iter_s": now - self._last_report,
            "time_total_s": self._time_before_restore_s + now - self._start,
            "time_since_restore": now - self._start,
            "iterations_since_restore": self.since_start,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
        }
        self._last_report = now
        return row
