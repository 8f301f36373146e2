"""Nodes known gone, dropped from torch's dynamic rendezvous state (agent/rendezvous/
gone_nodes.py): the heartbeats aged at once, and the next round's last call ended once
every survivor is in and nobody else waits -- over a backend that keeps the state in
memory, with torch's compare-and-set (a write with a stale token is refused). The e2e
proof is tests/e2e/test_node_liveness.py (c10d with 15 s heartbeats: 47 s before)."""

from __future__ import annotations

import pickle
from datetime import timedelta

import pytest
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    _NodeDesc,
    _RendezvousState,
)

from elastic_train.agent.rendezvous import gone_nodes
from tests.support.memory_rendezvous import (
    NOW,
    SPARE,
    A,
    B,
    C,
    MemoryBackend,
    finished_round,
    handler_over,
)

pytestmark = pytest.mark.compat  # torch's private state, on every supported torch (.ci/run)

def test_a_gone_node_is_aged_out_and_the_others_are_its_survivors():
    backend = MemoryBackend(finished_round())
    backend.meddle = lambda b: setattr(b, "token", b.token + 1)  # another node wrote first
    left = gone_nodes.forget(handler_over(backend), {2})
    assert left == gone_nodes.Left(4, frozenset({A, B}), 0)
    beats = backend.state().last_heartbeats
    assert beats[C] < NOW - timedelta(days=365) and beats[A] == NOW
    assert gone_nodes.forget(handler_over(backend), {7}) is None  # nobody of that rank
    other = type("OurEtcdHandler", (), {})()
    assert gone_nodes.forget(other, {2}) is None  # not torch's dynamic handler


def next_round(*joined: _NodeDesc, waiting=()) -> _RendezvousState:
    state = _RendezvousState()
    state.round, state.participants = 5, {node: 0 for node in joined}
    state.last_heartbeats = {node: NOW for node in joined}
    state.deadline = NOW + timedelta(seconds=30)  # torch's last call, running
    state.wait_list = set(waiting)
    return state


def test_the_last_call_ends_once_every_survivor_joined_and_nobody_waits():
    left = gone_nodes.Left(4, frozenset({A, B}))
    for state, ends in ((next_round(A), False), (next_round(A, B, waiting=[SPARE]), False),
                        (next_round(A, B), True), (next_round(A, B, SPARE), True)):
        backend = MemoryBackend(state)
        thread = gone_nodes.seal_when_joined(handler_over(backend), left, 0, within_s=0.3)
        thread.join(5)
        assert (backend.state().deadline == gone_nodes.LONG_AGO) is ends, state


def test_the_finished_round_is_waited_out_and_a_completed_next_round_left_alone():
    left = gone_nodes.Left(4, frozenset({A, B}))
    backend = MemoryBackend(finished_round())
    thread = gone_nodes.seal_when_joined(handler_over(backend), left, 0, within_s=5)
    assert thread.is_alive()  # still round 4
    backend.blob = pickle.dumps(next_round(A, B))
    thread.join(5)
    assert backend.state().deadline == gone_nodes.LONG_AGO
    done = next_round(A, B)
    done.complete = True
    backend = MemoryBackend(done)
    gone_nodes.seal_when_joined(handler_over(backend), left, 0, within_s=5).join(5)
    assert gone_nodes.seal_when_joined(handler_over(backend), left, 1, within_s=5) is None
    assert backend.state().deadline != gone_nodes.LONG_AGO
