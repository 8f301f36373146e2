"""The goodput ledger of each chaos trial's runs: do its causes add up?

After a trial, every run directory under the trial's storage path that has a ledger
is read with :func:`elastic_train.goodput.breakdown.breakdown`, as ``show`` and
``Result.goodput`` read it, and held to :mod:`tests.support.ledger_account`'s rule
(its wall time no longer than the trial took).

The figures go into the trial's row (``ledger_*``) and the suite's table; a ledger
that does not add up is reported there, not failed as a trial: the trial's own
checks are about the job, this one about the account of its time.
"""

from __future__ import annotations

from typing import Any

from elastic_train.goodput.breakdown import Cause, breakdown
from elastic_train.storage import RunStorage
from tests.conftest import StorageUnderTest
from tests.support.ledger_account import problems


def ledger_figures(storage: StorageUnderTest, trial_s: float) -> dict[str, Any]:
    """The row's ledger figures: runs read, the worst sum error and ``other`` share,
    and what did not add up (``ledger_problems``, by run)."""
    row: dict[str, Any] = {"ledger_runs": 0, "ledger_sum_err": 0.0, "ledger_other": 0.0,
                           "ledger_problems": {}}
    if not storage.fs.exists(storage.url):
        return row
    for entry in storage.fs.ls(storage.url, detail=True):
        if entry["type"] != "directory":
            continue
        goodput = breakdown(RunStorage(storage.fs, entry["name"]).read_ledger())
        if not goodput.wall_s:
            continue
        row["ledger_runs"] += 1
        error = abs(sum(goodput.seconds.values()) - goodput.wall_s) / goodput.wall_s
        row["ledger_sum_err"] = max(row["ledger_sum_err"], round(error, 6))
        row["ledger_other"] = max(row["ledger_other"], round(goodput.share(Cause.OTHER), 4),
                                  key=abs)
        if found := problems(goodput, trial_s):
            row["ledger_problems"][entry["name"].rstrip("/").rsplit("/", 1)[-1]] = found
    return row


def adds_up(row: dict[str, Any]) -> bool | None:
    """The trial's ledgers all added up; None when it has no ledger to read (a ledger
    that could not be read did not add up)."""
    if not row.get("ledger_runs") and not row.get("ledger_problems"):
        return None
    return not row["ledger_problems"]
