"""Nodes that left the job on their node policy's word, and their cooling-off periods.

A node that a :class:`~elastic_train.agent.node_policy.NodePolicy` sends away (a
failed health check, K failures in a row), or a straggler replaced by a spare
(``StragglerConfig(replace=True)``, :mod:`elastic_train.stragglers`), leaves with a
reason and a cooling-off period. It is kept out for that long, even if the cluster
starts its agent again at once: the leaving node writes a :class:`Departure` into the
run directory (``departures/<node>.json``, one file per node, so nodes that leave
together never overwrite each other: :meth:`~elastic_train.storage.RunStorage.write_departure`), and
every admission reads it (:mod:`elastic_train.agent.cooling_off`): the node's own
check before it joins a round, on every backend, and our etcd handler's sealer for
every node that joins. The node recording the run copies the departures into
``run.json`` (``departures``), which ``elastic-train show`` prints.

The period is wall-clock time (``left_at`` on the leaving node's clock): periods are
minutes, and the clocks of a job's nodes agree far better than that.

Example::

    gone = Departure("node7", "2 failures in a row charged to it", left_at=now,
                     cool_off_s=600)
    gone.remaining_s(now + 60)   # 540.0
    gone.refusal(now + 60)       # "node7 left the job at ... and cools off for another 540 s ..."
"""

from __future__ import annotations

import datetime
import time
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import quote

DIRECTORY = "departures"  # in the run directory: a file per node that left


def clock(timestamp: float) -> str:
    """A time in UTC, as the messages name it (``2026-11-26 14:05:09 UTC``)."""
    return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S UTC")


@dataclass(frozen=True)
class Departure:
    """A node that left the job: its name (as the rendezvous names it), why, when
    (``time.time()`` on its clock), and for how long it is not admitted again."""

    node: str
    reason: str
    left_at: float
    cool_off_s: float

    @property
    def until(self) -> float:
        """When the node may be admitted again."""
        return self.left_at + self.cool_off_s

    def remaining_s(self, now: float | None = None) -> float:
        """Seconds of cooling off left (0 once the period is over)."""
        return max(0.0, self.until - (time.time() if now is None else now))

    @property
    def file_name(self) -> str:
        """Its file in the run directory's :data:`DIRECTORY` (the node's name, quoted)."""
        return quote(self.node, safe="") + ".json"

    def refusal(self, now: float | None = None) -> str:
        """Why the node is not admitted now, and how to admit it sooner (one line)."""
        return (f"{self.node} left the job at {clock(self.left_at)} ({self.reason}) and cools "
                f"off for another {self.remaining_s(now):.0f} s, until {clock(self.until)}; "
                f"to admit it sooner, delete {DIRECTORY}/{self.file_name} in the run "
                "directory")

    def describe(self) -> str:
        """Which node, why, and for how long (as the console and ``show`` say it)."""
        return (f"Node {self.node} left the job: {self.reason}; not admitted again for "
                f"{self.cool_off_s:g} s, until {clock(self.until)}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Departure:
        return cls(node=str(data["node"]), reason=str(data.get("reason", "")),
                   left_at=float(data["left_at"]), cool_off_s=float(data.get("cool_off_s", 0)))
