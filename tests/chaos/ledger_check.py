"""The goodput ledger of each chaos trial's runs: do its causes add up?

After a trial, every run directory under the trial's storage path that has a ledger
is read with :func:`elastic_train.goodput.breakdown.breakdown`, as ``show`` and
``Result.goodput`` read it. A run's ledger adds up when its causes sum to its wall
time within 1 %, no cause but ``other`` is negative, ``other`` (time no writer
accounted for) lies within -1 % and 5 % of the wall time, and the wall time is no
longer than the trial took (a ledger cannot claim time that did not pass).

The figures go into the trial's row (``ledger_*``) and the suite's table; a ledger
that does not add up is reported there, not failed as a trial: the trial's own
checks are about the job, this one about the account of its time.
"""

from __future__ import annotations

from typing import Any

from elastic_train.goodput.breakdown import Cause, Goodput, breakdown
from elastic_train.storage import RunStorage
from tests.conftest import StorageUnderTest

SUM_TOLERANCE = 0.01  # the causes against the wall time
OTHER_RANGE = (-0.01, 0.05)  # "other": unaccounted time, as a share of the wall time


def problems(goodput: Goodput, trial_s: float) -> list[str]:
    """What is wrong with one run's account of its time (empty: it adds up)."""
    wall = goodput.wall_s
    found = []
    total = sum(goodput.seconds.values())
    if abs(total - wall) > SUM_TOLERANCE * wall:
        found.append(f"causes sum to {total:.2f} s of {wall:.2f} s")
    negative = {c.value: round(s, 3) for c, s in goodput.seconds.items()
                if c is not Cause.OTHER and s < 0}
    if negative:
        found.append(f"negative causes {negative}")
    other = goodput.share(Cause.OTHER)
    if not OTHER_RANGE[0] <= other <= OTHER_RANGE[1]:
        found.append(f"other is {other:.1%} of the wall time")
    if wall > trial_s:
        found.append(f"wall time {wall:.2f} s is longer than the trial's {trial_s:.2f} s")
    return found


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
    """The trial's ledgers all added up; None when it has no ledger figures."""
    if not row.get("ledger_runs"):
        return None
    return not row["ledger_problems"]
