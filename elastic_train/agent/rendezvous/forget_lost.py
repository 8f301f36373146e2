"""Nodes known gone leave torch's rendezvous state at once, not when their heartbeats expire.

torch's dynamic handler (our ``c10d`` and ``etcd-v3`` backends) drops a node only when
its last heartbeat is ``keep_alive_interval x keep_alive_max_attempt`` old (1 s x 3 by
default). Until then the lost node is still a participant of the complete round: the
survivors, and a spare parked in the redundancy list, wait for it, although the
survivors' probe of its beacon (:mod:`elastic_train.agent.node_liveness`) knew it gone
within a second. :func:`forget_lost` ages the heartbeats of the nodes known gone in the
shared state, so that the next sync of every node -- the survivor's own rendezvous, the
spare's poll -- removes them through torch's own sanitizer, as if they had expired.

It acts only on the round this node is still a participant of, with the rank this node
has in it (the ranks known gone are that round's group ranks), under the handler's
heartbeat lock, and gives up after a few lost compare-and-sets: then the heartbeats
expire as before. Our ``etcd`` backend needs none of this (its liveness records let a
round seal without the lost node).

Example::

    forget_lost(worker_group.spec.rdzv_handler, group_rank=0, gone={2})  # 1: dropped
"""

from __future__ import annotations

import logging
from collections.abc import Set
from datetime import datetime, timezone

from torch.distributed.elastic.rendezvous import RendezvousError, RendezvousHandler
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

logger = logging.getLogger(__name__)

_LONG_AGO = datetime(1970, 1, 1, tzinfo=timezone.utc)
_TRIES = 3  # compare-and-sets lost to other nodes' writes before giving up


def forget_lost(handler: RendezvousHandler, group_rank: int, gone: Set[int]) -> int:
    """How many nodes of ``gone`` (group ranks of this node's round, where this node is
    ``group_rank``) were dropped from ``handler``'s state: 0 when the handler is not
    torch's dynamic one, the round is over, or the state could not be written."""
    if not gone or not isinstance(handler, DynamicRendezvousHandler):
        return 0
    try:
        return _forget(handler, group_rank, gone)
    except RendezvousError as exc:  # the store is unreachable: torch's rendezvous says so
        logger.debug("Could not drop the lost nodes from the rendezvous (%r).", exc)
        return 0


def _forget(handler: DynamicRendezvousHandler, group_rank: int, gone: Set[int]) -> int:
    holder, me = handler._state_holder, handler._this_node
    with handler._heartbeat_lock:  # torch's heartbeat thread syncs the same holder
        for _ in range(_TRIES):
            holder.sync()
            state = holder.state
            if not state.complete or state.participants.get(me) != group_rank:
                return 0  # another round already: its ranks are not the ones known gone
            lost = [node for node, rank in state.participants.items()
                    if rank in gone and node != me]
            if not lost:
                return 0
            for node in lost:
                state.last_heartbeats[node] = _LONG_AGO
            holder.mark_dirty()
            if holder.sync():
                logger.info("Dropped the lost node(s) of group rank %s from the rendezvous "
                            "instead of waiting for their heartbeats to expire.",
                            sorted(gone))
                return len(lost)
    return 0
