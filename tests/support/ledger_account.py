"""Whether a run's goodput ledger accounts for its time: the rule the end-to-end tests
and the chaos suite hold every ledger to.

A ledger adds up when its causes sum to its wall time within 1 %, no cause but
``other`` is negative, ``other`` (time no writer accounted for) lies within -1 % and
5 % of the wall time, and, where the caller knows how long the run took, the wall time
is no longer than that (a ledger cannot claim time that did not pass).
"""

from __future__ import annotations

from elastic_train.goodput.breakdown import Cause, Goodput

SUM_TOLERANCE = 0.01  # the causes against the wall time
OTHER_RANGE = (-0.01, 0.05)  # "other": unaccounted time, as a share of the wall time


def problems(goodput: Goodput, took_s: float | None = None) -> list[str]:
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
    if took_s is not None and wall > took_s:
        found.append(f"wall time {wall:.2f} s is longer than the {took_s:.2f} s the run took")
    return found


def assert_adds_up(goodput: Goodput | None, took_s: float | None = None) -> None:
    assert goodput is not None and goodput.wall_s > 0, "the run has no goodput ledger"
    found = problems(goodput, took_s)
    assert not found, f"{'; '.join(found)}: {goodput.to_json()}"
