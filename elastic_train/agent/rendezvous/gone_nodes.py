"""Nodes known gone, dropped from torch's dynamic rendezvous at once (``c10d``, ``etcd-v3``).

torch's DynamicRendezvousHandler learns that a node is gone from its heartbeats
alone, so the survivors of a lost node sit through two waits that node liveness
(:mod:`elastic_train.agent.node_liveness`) makes needless:

1. The lost node stays a participant of the finished round until its heartbeats
   are ``keep_alive_interval`` x ``keep_alive_max_attempt`` old, and no next round
   starts before: :func:`forget` ages them in the stored state.
2. The next round, short of its maximum, waits ``last_call_timeout`` for more
   nodes: :func:`seal_when_joined` ends that wait once every survivor has joined
   and no other node waits to (a spare or a new node: then torch's last call
   runs as usual, so that it gets in). One survivor watches (the lowest-ranked),
   as often as 20 times a second: at any size, the reads of a few more nodes.

Both are compare-and-set writes of the stored state, as torch's own are; every
handler takes the change at its next read (:mod:`.state_poll`: every 0.1-1 s).
Our ``etcd`` handler needs neither: a lost node is absent from its next round,
whose sealer waits only for the liveness records of the last round -- which a
handler that has ``forget_gone(ranks)`` deletes for the nodes known gone.

Example::

    left = forget(handler, {2})           # group rank 2 is gone
    if left is not None:
        seal_when_joined(handler, left, my_rank, within_s=30)
"""

from __future__ import annotations

import logging
import pickle
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

from torch.distributed.elastic.rendezvous import RendezvousHandler
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

from elastic_train.agent.rendezvous.torch_state import CheckedBackend, backend_of, read_state

logger = logging.getLogger(__name__)

# A heartbeat, or a last call's deadline, older than any setting: past for every handler.
LONG_AGO = datetime(2000, 1, 1, tzinfo=timezone.utc)
SEAL_POLL_S = 0.05
_WRITE_ATTEMPTS = 10


@dataclass(frozen=True)
class Left:
    """A round some nodes left: its number, its other participants (the survivors), and
    the lowest group rank among them (the one that watches the next round)."""

    round: int
    survivors: frozenset[_NodeDesc]
    first: int = 0


def forget(handler: RendezvousHandler, ranks: set[int]) -> Left | None:
    """Ages the heartbeats of the finished round's participants of group ranks ``ranks``
    (known gone), so that every handler drops them at its next read. None when there
    is nothing more to do (not torch's dynamic handler, or nobody of ``ranks`` in it);
    a handler of ours with liveness records of its own forgets them itself."""
    if callable(own := getattr(handler, "forget_gone", None)):
        own(ranks)
        return None
    backend = backend_of(handler)
    left: Left | None = None

    def age(state: _RendezvousState) -> bool:
        nonlocal left
        aged = [node for node, rank in state.participants.items()
                if rank in ranks and node in state.last_heartbeats]
        others = {node: rank for node, rank in state.participants.items() if node not in aged}
        left = Left(state.round, frozenset(others), min(others.values(), default=0))
        for node in aged:
            state.last_heartbeats[node] = LONG_AGO
        return bool(aged)

    if backend is None or not ranks or not _edit(backend, age):
        return None
    logger.info("Dropped the node(s) of group rank %s, known gone, from the rendezvous.",
                sorted(ranks))
    return left


def seal_when_joined(handler: RendezvousHandler, left: Left, rank: int, within_s: float
                     ) -> threading.Thread | None:
    """On the survivor of group rank ``left.first`` (``rank`` is this node's): watches the
    round after ``left.round`` for up to ``within_s`` (in a thread, while the agent joins
    it) and ends its last call as soon as every survivor has joined and no other node
    waits to; returns the thread (None: another survivor watches, or not torch's
    dynamic handler)."""
    backend = backend_of(handler)
    if backend is None or not left.survivors or rank != left.first:
        return None
    thread = threading.Thread(target=_seal, args=(backend, left, within_s),
                              name="rendezvous-seal", daemon=True)
    thread.start()
    return thread


def _seal(backend: CheckedBackend, left: Left, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        found = backend.get_state()
        if found is None:
            return
        state = read_state(found[0], backend.where)
        if state.round > left.round:  # the next round
            if state.complete or state.closed:
                return
            if _ready(state, left.survivors) and _edit(backend, _end_last_call(left)):
                logger.info("Every surviving node joined the new round: its last call "
                            "ends now.")
                return
        time.sleep(SEAL_POLL_S)


def _ready(state: _RendezvousState, survivors: frozenset[_NodeDesc]) -> bool:
    """Whether the round is in its last call, every survivor is in, and nobody waits."""
    return (state.deadline is not None and survivors <= set(state.participants)
            and not state.wait_list and not state.redundancy_list)


def _end_last_call(left: Left) -> Callable[[_RendezvousState], bool]:
    def end(state: _RendezvousState) -> bool:
        if state.round <= left.round or state.complete or state.closed \
                or not _ready(state, left.survivors):
            return False
        state.deadline = LONG_AGO
        return True

    return end


def _edit(backend: CheckedBackend, change: Callable[[_RendezvousState], bool]) -> bool:
    """Applies ``change`` to the stored state (it returns whether it changed anything)
    with a compare-and-set; reads again when another node wrote first. Returns whether
    a change was written."""
    for _ in range(_WRITE_ATTEMPTS):
        found = backend.get_state()
        if found is None:
            return False
        state = read_state(found[0], backend.where)
        if not change(state):
            return False
        answer = backend.set_state(pickle.dumps(state), found[1])
        if answer is not None and answer[2]:
            return True
    return False
