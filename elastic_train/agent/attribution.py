"""Whose fault a failed attempt of a multi-node job is, settled between the nodes' agents.

Each node's agent charges its restart budget only for failures of its own
workers; a restart caused by a peer is free. An agent sees its own workers
only, so after a failed attempt each one tells the others, through the
rendezvous store, how its workers ended (:mod:`.failures`) and when, and the
node at fault is:

1. a node whose worker ended by itself (a signal, an exit without an
   exception) -- each such node charges itself;
2. otherwise, once every node has told, the node whose worker raised first
   (ties: the lowest group rank); a worker whose collective broke (torch's
   ``DistError``) counts as never first;
3. otherwise nobody: a node that does not tell within ``wait_s`` left the job
   (a membership change, not a failure) or is slow to see its failure; it
   settles its own case when it does.

So every failed attempt in which all nodes took part is charged to some node:
a rank that fails the same way in every attempt ends the job within its
node's budget, whatever its message says.

Example::

    mine = NodeReport.of(group_rank=0, observed=observe(result))
    others = FailureExchange(store, generation).share(mine, nodes=2)
    at_fault = charged(mine, others, nodes=2)    # None: nobody
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from elastic_train.agent.failures import Cause, Observed
from elastic_train.errors import WorkerFailure

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeReport:
    """What one node tells the others about its failed attempt.

    ``own``: one of its workers ended by itself. ``first``: when its earliest
    worker raised (``inf``: none did, only collectives broke). ``root``: its root
    cause, shown by the other nodes if the job ends because of it.
    """

    group_rank: int
    own: bool
    first: float
    root: WorkerFailure

    @classmethod
    def of(cls, group_rank: int, observed: Sequence[Observed]) -> NodeReport:
        raised = [o.at for o in observed if o.cause is Cause.RAISED]
        return cls(group_rank, any(o.cause is Cause.OWN for o in observed),
                   min(raised, default=math.inf), observed[0].failure)

    def to_json(self) -> str:
        return json.dumps({"group_rank": self.group_rank, "own": self.own,
                           "first": None if math.isinf(self.first) else self.first,
                           "root": self.root.to_json()})

    @classmethod
    def from_json(cls, text: str | bytes) -> NodeReport:
        data: dict[str, Any] = json.loads(text)
        first = data["first"]
        return cls(int(data["group_rank"]), bool(data["own"]),
                   math.inf if first is None else float(first),
                   WorkerFailure.from_json(data["root"]))


def charged(mine: NodeReport, others: Sequence[NodeReport], nodes: int) -> NodeReport | None:
    """The node at fault for the attempt (rules in the module doc), or None for nobody."""
    if mine.own:
        return mine
    culprits = [o for o in others if o.own]
    if culprits:
        return min(culprits, key=lambda o: o.group_rank)
    if len(others) < nodes - 1:
        return None
    return min([mine, *others], key=lambda o: (o.first, o.group_rank))


class FailureExchange:
    """The reports of one generation of the group, through the rendezvous ``store``."""

    def __init__(self, store: Any, generation: str, wait_s: float = 3.0, poll_s: float = 0.05):
        self.store = store
        self.prefix = f"elastic_train/failed/{generation}/"
        self.wait_s = wait_s
        self.poll_s = poll_s

    def share(self, mine: NodeReport, nodes: int) -> list[NodeReport]:
        """Tells ``mine``; returns the other nodes' reports, waiting for them (up to
        ``wait_s``) unless ``mine`` settles the case alone. An unreachable store
        (its host is gone) yields what was read so far."""
        others: dict[int, NodeReport] = {}
        try:
            self.store.set(f"{self.prefix}{mine.group_rank}", mine.to_json())
            deadline = time.monotonic() + self.wait_s
            while not mine.own and len(others) < nodes - 1 \
                    and not any(o.own for o in others.values()):
                for rank in set(range(nodes)) - {mine.group_rank} - set(others):
                    key = f"{self.prefix}{rank}"
                    if self.store.check([key]):
                        others[rank] = NodeReport.from_json(self.store.get(key))
                if time.monotonic() > deadline:
                    break
                time.sleep(self.poll_s)
        except Exception as exc:  # noqa: BLE001 -- the rendezvous will tell what is wrong
            logger.debug("Failure reports unavailable (%r); deciding alone.", exc)
        return list(others.values())
