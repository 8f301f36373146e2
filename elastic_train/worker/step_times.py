"""This rank's step time, measured for straggler scores (:mod:`elastic_train.stragglers`).

A rank's step time is its own time -- wall time outside ``report()`` -- since its
previous report, divided by the ``elastic_train.step()`` markers it passed since
(per report when it passes none). Time waiting in ``report()``'s collective is
left out, so a fast rank that waits there for a slow one does not look slow too.
Waits in the training's own collectives (DDP's gradient all_reduce) are not: in
lock-step data-parallel training a slow rank holds every rank back inside the
step, and the scores tell apart only the part of the slowness that precedes the
report. The time reaches rank 0 in the all_reduce every ``report()`` makes
anyway (:meth:`~.control_group.ControlGroup.any_rank_and_each`): no extra
collective.

Example::

    clock = StepClock()
    for batch in loader:
        ...
        clock.step()
    step_time = clock.report_begins()  # seconds per step since the last report
    ...                                # the report's collectives
    clock.report_ends()
"""

from __future__ import annotations

import time


class StepClock:
    """Counts ``step()`` markers and the rank's own time between reports."""

    def __init__(self) -> None:
        self._since = time.monotonic()
        self._steps = 0

    def step(self) -> None:
        """One training step of this rank is done."""
        self._steps += 1

    def report_begins(self) -> float:
        """The step time since the last report (seconds per marker, or the whole
        interval without markers); counting starts over."""
        own = time.monotonic() - self._since
        steps, self._steps = self._steps, 0
        return own / max(steps, 1)

    def report_ends(self) -> None:
        """The report returned: the rank's own time runs again."""
        self._since = time.monotonic()
