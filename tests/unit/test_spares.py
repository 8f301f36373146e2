"""Whether a spare waits (agent/rendezvous/spares.py), asked of each kind of handler:
torch's dynamic one (its redundancy list, read through the checked reader, dead spares
left out), ours on etcd (its own count), any other (none). Over the in-memory backend of
tests/support/memory_rendezvous.py; the e2e proof is tests/e2e/test_straggler_replacement.py."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest
from torch.distributed.elastic.rendezvous import RendezvousStateError

from elastic_train.agent.rendezvous import spares
from tests.support.memory_rendezvous import (
    NOW,
    SPARE,
    MemoryBackend,
    finished_round,
    handler_over,
)

pytestmark = pytest.mark.compat  # torch's private state, on every supported torch (.ci/run)

LATE = SPARE.__class__("host9", 109, 0)


def test_a_spare_in_torchs_redundancy_list_waits():
    state = finished_round()
    assert spares.waiting(handler_over(MemoryBackend(state))) == 0
    state.redundancy_list = {SPARE}
    state.last_heartbeats[SPARE] = NOW
    assert spares.waiting(handler_over(MemoryBackend(state))) == 1


def test_a_spare_whose_heartbeats_stopped_does_not_count():
    """Older than keep_alive_interval x keep_alive_max_attempt: torch would drop it."""
    state, now = finished_round(), datetime.now(timezone.utc)  # NOW is the module's import
    state.redundancy_list = {SPARE, LATE}
    state.last_heartbeats.update({SPARE: now, LATE: now - timedelta(seconds=60)})
    handler = handler_over(MemoryBackend(state))
    assert spares.waiting(handler) == 2  # no settings known: every listed spare
    handler.settings = SimpleNamespace(keep_alive_interval=timedelta(seconds=5),
                                       keep_alive_max_attempt=3)
    assert spares.waiting(handler) == 1
    assert spares.alive_spares(state, timedelta(seconds=15), now=now + timedelta(seconds=20)) \
        == 0


def test_a_state_that_is_no_rendezvous_state_is_refused_not_unpickled():
    backend = MemoryBackend(finished_round())
    backend.blob = b"\x80\x04garbage"
    with pytest.raises(RendezvousStateError):
        spares.waiting(handler_over(backend))


def test_our_etcd_handler_counts_its_own_and_other_handlers_have_none():
    ours = type("OurEtcdHandler", (), {"spares_waiting": lambda self: 2})()
    assert spares.waiting(ours) == 2
    assert spares.waiting(type("StaticHandler", (), {})()) == 0  # nobody waits
