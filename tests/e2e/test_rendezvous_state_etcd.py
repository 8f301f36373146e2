"""Our etcd handler's state, as another client writes it into a real etcd server: the round
pointer and a round's seal, fuzzed (#24). As tests/unit/test_rendezvous_state_fuzz.py
(which runs many more examples over etcd in memory): the handler follows a well-formed
value, or stops with a RendezvousStateError naming the key; never another exception.

Skipped when the ``etcd`` binary (Debian: etcd-server) or ``etcd3gw`` is missing.
"""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from torch.distributed.elastic.rendezvous import (
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStateError,
)

from tests.support.etcd_server import client

pytest.importorskip("etcd3gw", reason="etcd3gw is not installed (pip install etcd3gw)")

from elastic_train.agent.rendezvous.etcd_native import Keys, create_handler  # noqa: E402
from elastic_train.agent.rendezvous.etcd_rounds import Seal  # noqa: E402
from elastic_train.agent.rendezvous.etcd_v3 import run_prefix  # noqa: E402

WELL_FORMED = Seal(3, (), "127.0.0.1", 29500).encode()
round_values = st.binary(max_size=24) | st.integers(-5, 10**6).map(lambda i: b"%d" % i) \
    | st.text("0123456789-+ _\n", min_size=1, max_size=6).map(str.encode)


@pytest.fixture(scope="module")
def endpoint(etcd_endpoint):
    """The session's etcd; the sealer hosts no TCPStore for the workers (names a port)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
        yield etcd_endpoint


def _join_with(endpoint: str, key_of, value: bytes, **conf):
    """A fresh run whose ``key_of(keys)`` holds ``value`` (written with no lease, as a stray
    client would); one node's rendezvous: its RendezvousInfo, or the error it raised."""
    run_id = f"fuzz-{uuid.uuid4().hex[:8]}"
    keys = Keys(run_prefix(run_id).encode() + b"native/")
    etcd = client(endpoint)
    for key, data in key_of(keys):
        etcd.put(key, data)
    params = RendezvousParameters("etcd", endpoint, run_id, 1, 1, local_addr="127.0.0.1",
                                  join_timeout=10, **conf)
    handler = create_handler(params)
    try:
        return handler.next_rendezvous(), keys
    except RendezvousStateError as exc:
        return exc, keys
    finally:
        handler.release()
        etcd.delete_prefix(run_prefix(run_id))


@pytest.mark.timeout(120)
@settings(max_examples=50, deadline=None, database=None,
          phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(value=round_values)
@example(value=b"-3")
@example(value=b"007")
@example(value=b"12")
def test_any_round_pointer_in_etcd_is_followed_or_a_state_error(endpoint, value):
    outcome, keys = _join_with(endpoint, lambda keys: [(keys.round, value)], value)
    if isinstance(outcome, RendezvousStateError):
        assert keys.round.decode() in str(outcome) and repr(value[:60]) in str(outcome)
    else:
        assert isinstance(outcome, RendezvousInfo) and outcome.world_size == 1
        assert value.isdigit() and value == b"%d" % int(value)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seal", [
    b"[" * 5000, b'[1e999, [], "h", 1]', b'[5, [0], "h", 29500]', b"\xff\xfe", b"",
    WELL_FORMED,  # the node waits for round 1
], ids=["deep", "infinite", "one-revision-twice", "not-utf8", "empty", "well-formed"])
def test_a_seal_in_etcd_is_followed_or_a_state_error(endpoint, seal):
    outcome, keys = _join_with(endpoint, lambda keys: [(keys.round, b"0"),
                                                       (keys.seal(0), seal)], seal,
                               keep_alive_interval=1, keep_alive_max_attempt=1)
    if isinstance(outcome, RendezvousStateError):
        assert keys.seal(0).decode() in str(outcome)
        assert seal != WELL_FORMED
    else:  # nobody of round 0 is alive: after a lease TTL it opens round 1 and forms it
        assert isinstance(outcome, RendezvousInfo) and outcome.world_size == 1
        assert seal == WELL_FORMED
