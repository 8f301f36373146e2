"""Figure 19: what rank 0's metrics row and ledger line cost a report on S3, against the
number of reports before it.

S3 cannot append: a report's row used to be uploaded with the whole history again (one
PUT of every row so far), so its cost grew with the run, and the bytes with the square
of its reports. Now a row goes to the last segment of ``metrics.jsonl.d/`` (at most
64 KiB: :mod:`elastic_train.storage.jsonl_log`), and so does a ledger line. This
times, on moto's S3 server through s3fs, in this process, what rank 0's committer and
report clock call at each report: :meth:`RunStorage.append_metrics` with a row of the
issue's size (~9 KiB: 5.5 MB after 600 reports), and a ledger line; beside them, the
old way, one PUT of the whole history, timed on the same server. Goal: the row's cost
at the last count no more than 1.5 × at the first (flat).

Run: ``python -m bench --only metrics_row`` (``--smoke``: fewer reports).
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import fsspec

from bench.report import Table
from bench.stats import Target
from elastic_train.storage import RunStorage
from elastic_train.storage import filesystem as fsutil

if TYPE_CHECKING:
    from bench.suite import Suite

FLAT_TARGET = Target(1.5, at_least=False)  # the row's median cost, last count / first
ROW_PAD = 9000  # bytes of padding per row: the rows (5.5 MB after 600 reports)
WINDOW = 10  # reports timed around each count


def _row(i: int) -> dict[str, Any]:
    return {"training_iteration": i, "loss": 1.0 / i, "pad": "x" * ROW_PAD}


def _timed(fn: Callable[[], None]) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


def _costs(run: RunStorage, reports: int) -> dict[str, list[float]]:
    """Milliseconds of each report's row, ledger line and whole-history PUT (the old way)."""
    ledger, history = run.ledger_file("rank0"), []
    old = f"{run.run_path}/old-metrics.jsonl"
    took: dict[str, list[float]] = {"row": [], "line": [], "whole": []}
    for i in range(1, reports + 1):
        history.append(_row(i))
        took["row"].append(_timed(lambda: run.append_metrics(history[-1], history)))
        line = {"event": "work", "t": time.time(), "iteration": i, "productive": 1.0}
        took["line"].append(_timed(lambda: ledger.append(line)))  # noqa: B023 (called now)
        data = "".join(json.dumps(r) + "\n" for r in history).encode()
        took["whole"].append(_timed(
            lambda: fsutil.write_bytes_atomic(run.fs, old, data)))  # noqa: B023 (called now)
    return took


def _median_at(values: list[float], count: int) -> float:
    """The median of the :data:`WINDOW` reports that end at report ``count``."""
    return statistics.median(values[max(0, count - WINDOW):count])


def metrics_row(suite: Suite) -> list[Table]:
    """Figure 19: one row per report count of the profile's ``metrics_reports``."""
    from tests.support.servers import MotoS3Server, s3_options

    counts = suite.profile.metrics_reports
    moto = MotoS3Server()
    try:
        options = s3_options(moto.endpoint)
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        fsspec.filesystem("s3", **options).mkdir(bucket)
        run = RunStorage.open(f"s3://{bucket}", "run", options=options)
        took = _costs(run, max(counts))
    finally:
        moto.stop()
    table = Table("Figure 19 — a report's metrics row and ledger line on S3 (moto), against "
                  f"the reports before it (median ms of the {WINDOW} reports up to each count)",
                  ["reports", "row (segments)", "ledger line (segments)",
                   "row the old way (whole history)", "history (MB)"])
    for count in counts:
        table.add(count, f"{_median_at(took['row'], count):.1f}",
                  f"{_median_at(took['line'], count):.1f}",
                  f"{_median_at(took['whole'], count):.1f}",
                  f"{count * (ROW_PAD + 60) / 1e6:.2f}")
    first, last = (_median_at(took["row"], c) for c in (counts[0], counts[-1]))
    table.notes = [
        f"Row at {counts[-1]} reports / at {counts[0]}: {last / first:.2f} "
        f"{FLAT_TARGET.describe()} {FLAT_TARGET.verdict(last / first)}.",
        "One process, moto's server on 127.0.0.1 (no network): a real S3 PUT costs more per "
        "request, and the old way's cost grows with the bytes it sends again.",
    ]
    return [table]
