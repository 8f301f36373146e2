"""Whose fault a failed attempt of a multi-node job is, settled between the nodes' agents.

Each node's agent charges its restart budget only for failures of its own
workers; a restart caused by a peer is free. An agent sees its own workers
only, so after a failed attempt each one tells the others, through the
rendezvous store, how its workers ended (:mod:`.failures`) and in which order,
and the node at fault is:

1. a node whose worker ended by itself (a signal, an exit without an
   exception) -- each such node charges itself;
2. otherwise, once every node has told, the node whose worker raised first
   in the group's order of failures -- a counter in the group's store that
   each worker takes as it fails, before its peers can see it gone (see
   :func:`~elastic_train.worker.lifecycle.failure_sequence`); never by the
   nodes' clocks, which may be further apart than a failure and the error it
   causes on another node. A worker whose collective broke (torch's
   ``DistError``), or that could not take its place, counts as never first;
   ties go to the node that told first (a counter in the round's store), then
   to the lowest group rank;
3. otherwise nobody: a node that does not tell within ``wait_s`` left the job
   (a membership change, not a failure) or is slow to see its failure; it
   settles its own case when it does. Nobody waits for a node known gone
   (:mod:`.node_liveness`): the exchange ends once every node that has not told
   is, and an attempt in which a node was lost is charged to none of the
   survivors -- their workers' errors are what the loss caused -- unless one of
   theirs ended by itself (rule 1).

So every failed attempt in which all nodes took part is charged to some node:
a rank that fails the same way in every attempt ends the job within its
node's budget, whatever its message says.

Example::

    exchange = FailureExchange(store, generation)
    mine = exchange.announce(NodeReport.of(group_rank=0, observed=observe(result)))
    others = exchange.share(mine, nodes=2, gone=liveness.gone)
    at_fault = charged(mine, others, nodes=2, lost=liveness.gone())  # None: nobody
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from elastic_train.agent.failures import Cause, Observed
from elastic_train.errors import WorkerFailure

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeReport:
    """What one node tells the others about its failed attempt.

    ``own``: one of its workers ended by itself. ``first``: the place of its
    earliest raise in the group's order of failures (``inf``: none did, only
    collectives broke, or unknown). ``root``: its root cause, shown by the other
    nodes if the job ends because of it. ``announced``: its place in the order in
    which the nodes told (``inf``: not told yet).
    """

    group_rank: int
    own: bool
    first: float
    root: WorkerFailure
    announced: float = math.inf

    @classmethod
    def of(cls, group_rank: int, observed: Sequence[Observed]) -> NodeReport:
        raised = [o.seq for o in observed if o.cause is Cause.RAISED]
        return cls(group_rank, any(o.cause is Cause.OWN for o in observed),
                   min(raised, default=math.inf), observed[0].failure)

    def to_json(self) -> str:
        return json.dumps({"group_rank": self.group_rank, "own": self.own,
                           "first": None if math.isinf(self.first) else self.first,
                           "root": self.root.to_json(),
                           "announced": None if math.isinf(self.announced) else self.announced})

    @classmethod
    def from_json(cls, text: str | bytes) -> NodeReport:
        data: dict[str, Any] = json.loads(text)
        first, announced = data["first"], data.get("announced")
        return cls(int(data["group_rank"]), bool(data["own"]),
                   math.inf if first is None else float(first),
                   WorkerFailure.from_json(data["root"]),
                   math.inf if announced is None else float(announced))


def charged(mine: NodeReport, others: Sequence[NodeReport], nodes: int,
            lost: Iterable[int] = ()) -> NodeReport | None:
    """The node at fault for the attempt (rules in the module doc), or None for nobody;
    ``lost``: the group ranks known gone."""
    if mine.own:
        return mine
    culprits = [o for o in others if o.own]
    if culprits:
        return min(culprits, key=lambda o: o.group_rank)
    if len(others) < nodes - 1 or set(lost) - {mine.group_rank}:
        return None
    return min([mine, *others], key=lambda o: (o.first, o.announced, o.group_rank))


def at_fault_of(reports: Sequence[NodeReport]) -> NodeReport:
    """Of reports that other nodes told (at least one), the node at fault as the rules
    above order them: one whose worker ended by itself, else the earliest raise, ties to
    the node that told first, then to the lowest group rank."""
    return min(reports, key=lambda o: (not o.own, o.first, o.announced, o.group_rank))


class FailureExchange:
    """The reports of one generation of the group, through the rendezvous ``store``."""

    def __init__(self, store: Any, generation: str, wait_s: float = 3.0, poll_s: float = 0.05,
                 gone_every_s: float = 0.1):
        self.store = store
        self.prefix = f"elastic_train/failed/{generation}/"
        self.wait_s = wait_s
        self.poll_s = poll_s
        self.gone_every_s = gone_every_s

    def announce(self, mine: NodeReport) -> NodeReport:
        """``mine`` with its place in the order in which the nodes tell (unchanged if
        the store is unreachable)."""
        try:
            return dataclasses.replace(mine, announced=float(self.store.add(
                f"{self.prefix}announced", 1)))
        except Exception as exc:  # noqa: BLE001 -- the rendezvous will tell what is wrong
            logger.debug("Failure order unavailable (%r).", exc)
            return mine

    def share(self, mine: NodeReport, nodes: int,
              gone: Callable[[Iterable[int]], set[int]] | None = None) -> list[NodeReport]:
        """Tells ``mine`` (announce it first: see :meth:`announce`); returns the other
        nodes' reports, waiting for them (up to ``wait_s``, and not for the nodes that
        ``gone(ranks)`` says of ``ranks`` are gone, asked every ``gone_every_s``) unless
        ``mine`` settles the case alone. An unreachable store (its host is gone)
        yields what was read so far."""
        others: dict[int, NodeReport] = {}
        try:
            self.store.set(f"{self.prefix}{mine.group_rank}", mine.to_json())
            deadline = time.monotonic() + self.wait_s
            ask_at = time.monotonic() + self.poll_s  # the first look may find them all
            while not mine.own and len(others) < nodes - 1 \
                    and not any(o.own for o in others.values()):
                missing = set(range(nodes)) - {mine.group_rank} - set(others)
                for rank in missing:
                    key = f"{self.prefix}{rank}"
                    if self.store.check([key]):
                        others[rank] = NodeReport.from_json(self.store.get(key))
                missing -= set(others)
                if time.monotonic() > deadline:
                    break
                if gone is not None and missing and time.monotonic() >= ask_at:
                    if missing <= gone(missing):
                        break
                    ask_at = time.monotonic() + self.gone_every_s
                time.sleep(self.poll_s)
        except Exception as exc:  # noqa: BLE001 -- the rendezvous will tell what is wrong
            logger.debug("Failure reports unavailable (%r); deciding alone.", exc)
        return list(others.values())

    def told(self, nodes: int, group_rank: int) -> list[NodeReport]:
        """The reports the other nodes of ``nodes`` told so far, without waiting: asked by
        a node whose workers are healthy as its group restarts for a node waiting to
        join, which may be one that failed and went on to the rendezvous before this
        node's workers saw it. An unreachable store: none."""
        try:
            if not int(self.store.add(f"{self.prefix}announced", 0)):
                return []
            keys = {rank: f"{self.prefix}{rank}" for rank in range(nodes) if rank != group_rank}
            return [NodeReport.from_json(self.store.get(key)) for key in keys.values()
                    if self.store.check([key])]
        except Exception as exc:  # noqa: BLE001 -- the rendezvous will tell what is wrong
            logger.debug("Failure reports unavailable (%r).", exc)
            return []
