"""A node known gone leaves torch's rendezvous state at once (agent/rendezvous/forget_lost.py).

torch's c10d handler, as the agent builds it, over a real TCPStore holding a complete
round of two nodes; it forgets the other node, as a survivor does before its next
rendezvous. The process-level proof (a spare takes a lost c10d node's place long before
its heartbeats expire) is tests/e2e/test_node_loss_in_process.py.
"""

from __future__ import annotations

import base64
import pickle
from datetime import datetime, timedelta, timezone
from unittest import mock

import pytest
import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousParameters, c10d_rendezvous_backend
from torch.distributed.elastic.rendezvous import registry as rdzv_registry
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

from elastic_train.agent.rendezvous.forget_lost import forget_lost
from elastic_train.agent.rendezvous.registry import register
from elastic_train.rendezvous_backends import lookup

RUN = "forget"


@pytest.fixture
def pair():
    """A handler of a c10d job (``--nnodes 2``) whose state has a complete round of this
    node and another (as torch's handler writes it), their ranks, and the store."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=10))
    register(lookup("c10d", "test"))
    with mock.patch.object(c10d_rendezvous_backend, "_create_tcp_store", lambda _: store):
        mine = rdzv_registry.get_rendezvous_handler(RendezvousParameters(
            "c10d", f"127.0.0.1:{store.port}", RUN, 2, 2, local_addr="127.0.0.1"))
    other = _NodeDesc("10.0.0.2", 4321, 0)
    state = _RendezvousState()
    state.round, state.complete = 1, True
    state.participants = {mine._this_node: 0, other: 1}
    state.last_heartbeats = dict.fromkeys(state.participants, datetime.now(timezone.utc))
    assert mine._state_holder._backend.set_state(pickle.dumps(state))[2]
    yield mine, (0, 1), store


def _stored(store):
    return pickle.loads(base64.b64decode(store.get(f"torch.rendezvous.{RUN}")))


def test_a_node_known_gone_is_aged_out_of_the_round(pair):
    mine, (my_rank, other_rank), store = pair
    assert forget_lost(mine, my_rank, {other_rank}) == 1
    state = _stored(store)
    other_node = next(n for n, r in state.participants.items() if r == other_rank)
    assert state.last_heartbeats[other_node] < datetime.now(timezone.utc) - timedelta(days=1)
    assert state.complete and len(state.participants) == 2  # torch's sanitizer removes it
    mine._state_holder.sync()  # on the next read of any node, as if its heartbeats expired
    assert dict(mine._state_holder.state.participants) == {mine._this_node: my_rank}


def test_nothing_is_forgotten_in_a_round_this_node_does_not_hold_that_rank_in(pair):
    mine, (my_rank, other_rank), store = pair
    before = _stored(store).last_heartbeats
    assert forget_lost(mine, other_rank, {my_rank}) == 0  # ranks of another round
    assert forget_lost(mine, my_rank, {my_rank}) == 0  # never itself
    assert forget_lost(mine, my_rank, set()) == 0
    assert _stored(store).last_heartbeats == before


def test_other_handlers_are_left_alone():
    handler = mock.Mock(spec=["next_rendezvous"])  # e.g. our etcd handler: no torch state
    assert forget_lost(handler, 0, {1}) == 0
