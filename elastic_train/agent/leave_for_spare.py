"""Whether this node leaves the job now for a spare: asked to, and a spare waits.

A node can be asked to leave a running job while nothing failed: with
``StragglerConfig(replace=True)`` the driver asks when this node is the straggler
named in the run of slow reports still going on (see :mod:`elastic_train.stragglers`).
It leaves only when a spare actually waits to take its ranks (:mod:`.rendezvous.spares`):
leaving without one would shrink the job, or stop it below ``--nnodes`` MIN, which is
worse than a slow node. Without a spare it stays, and says so once per request; the
request is asked again at every look, so a spare that comes later is still taken, and a
request the driver withdrew (the node is no longer slow) is not. The node serving a
``c10d`` rendezvous store is never asked (:mod:`.rendezvous.store_host`): the job would
end with its store.

The agent asks :meth:`LeaveForSpare.verdict` at each look at a healthy group; the
rendezvous state is read at most every ``look_s`` while a request stands, never
otherwise.

Example::

    swap = LeaveForSpare(request=lambda: leave("straggler", 600), spares=lambda: 1)
    swap.verdict()  # NodeVerdict(leave=True, reason='straggler', cool_off_s=600)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from elastic_train.agent.node_policy import NodeVerdict

logger = logging.getLogger(__name__)

LOOK_S = 1.0  # how often a standing request reads the rendezvous state for spares


class LeaveForSpare:
    """``request()``: the verdict this node is asked to leave with (None: not asked);
    ``spares()``: how many spares wait now."""

    def __init__(self, request: Callable[[], NodeVerdict | None], spares: Callable[[], int],
                 look_s: float = LOOK_S, clock: Callable[[], float] = time.monotonic):
        self._request, self._spares = request, spares
        self._look_s, self._clock = look_s, clock
        self._looked_at: float | None = None
        self._told: NodeVerdict | None = None  # the request last told that no spare waits

    def verdict(self) -> NodeVerdict | None:
        """The verdict to leave with now: a request stands and a spare waits; else None."""
        asked = self._request()
        if asked is None or not asked.leave:
            return None
        now = self._clock()
        if self._looked_at is not None and now - self._looked_at < self._look_s:
            return None
        self._looked_at = now
        try:
            spares = self._spares()
        except Exception:  # noqa: BLE001 -- an unreadable state: no spare known, stay
            logger.warning("Could not read whether a spare waits; this node stays for now",
                           exc_info=True)
            spares = 0
        if spares > 0:
            return asked
        if asked != self._told:
            self._told = asked
            logger.warning("This node is asked to leave the job (%s), but no spare waits "
                           "to take its place: it stays.", asked.reason)
        return None
