"""Keeps a node that left the job out for its cooling-off period.

:class:`CoolingOff` wraps the job's node policy (:mod:`.node_policy`): before the
policy is asked, it refuses a candidate whose latest departure
(:class:`~elastic_train._internal.departures.Departure`, read from the run directory) is still
cooling off, naming the time left. Because the agent hands its policy to the
rendezvous, the same wrapper answers both questions the module :mod:`.node_policy`
lists: the node's own check before every round (every backend: a node whose agent
the cluster started again at once refuses itself), and our etcd handler's sealer for
every node that joins.

The departures are read at most once per ``refresh_s`` (a sealer asks about every
node of a round: one listing serves them all); a failed read admits, with a warning,
since admission must not fail on storage the training itself will retry.

Example::

    policy = CoolingOff(HealthPolicy(), storage.read_departures)
    policy.admit(Candidate("node7", here=True))  # refused while node7 cools off
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from elastic_train._internal.departures import Departure
from elastic_train.agent.node_policy import (
    Admission,
    Candidate,
    ChargedFailures,
    NodePolicy,
    NodeVerdict,
    refused,
)

logger = logging.getLogger(__name__)


class CoolingOff(NodePolicy):
    """``policy``, except that nodes cooling off (per ``departures()``) are not admitted."""

    def __init__(self, policy: NodePolicy, departures: Callable[[], list[Departure]],
                 refresh_s: float = 2.0, clock: Callable[[], float] = time.time):
        self.policy, self._departures, self._refresh_s = policy, departures, refresh_s
        self._clock = clock
        self._read_at: float | None = None
        self._latest: dict[str, Departure] = {}

    def after_failure(self, charged: ChargedFailures) -> NodeVerdict:
        return self.policy.after_failure(charged)

    def admit(self, candidate: Candidate) -> Admission:
        now = self._clock()
        departure = self._latest_departures(now).get(candidate.name)
        if departure is not None and departure.remaining_s(now) > 0:
            return refused(departure.refusal(now))
        return self.policy.admit(candidate)

    def _latest_departures(self, now: float) -> dict[str, Departure]:
        """Each node's latest departure, as read at most ``refresh_s`` ago."""
        if self._read_at is None or now - self._read_at >= self._refresh_s:
            try:
                self._latest = {d.node: d for d in self._departures()}  # oldest first
            except Exception:  # noqa: BLE001 -- admission must not fail on storage
                logger.warning("Could not read which nodes left the job; admitting without "
                               "their cooling-off periods this time", exc_info=True)
            self._read_at = now
        return self._latest
