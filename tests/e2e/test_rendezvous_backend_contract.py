"""torch's ``RendezvousBackend`` contract, run against our backend on a real etcd.

The contract is what torch's own backend tests demand of every backend
(test/distributed/elastic/rendezvous/rendezvous_backend_test.py in torch's
repository): ``set_state`` is compare-and-set on an opaque fencing token and,
when it does not set, hands back the current state and token -- also for a
token it never issued; ``get_state`` is None for no state and raises
``RendezvousStateError`` for a corrupt one. torch's DynamicRendezvousHandler
relies on each of these.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from torch.distributed.elastic.rendezvous import RendezvousParameters, RendezvousStateError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend

pytest.importorskip("etcd3gw", reason="etcd3gw is not installed (pip install etcd3gw)")

from elastic_train.agent.rendezvous.etcd_v3 import create_backend  # noqa: E402

pytestmark = pytest.mark.timeout(60)


@dataclass
class BackendUnderTest:
    backend: RendezvousBackend
    corrupt: Callable[[], None]  # writes a state value the backend never wrote


def _etcd_v3(endpoint: str) -> tuple[BackendUnderTest, Callable[[], None]]:
    params = RendezvousParameters(backend="etcd-v3", endpoint=endpoint,
                                  run_id=uuid.uuid4().hex, min_nodes=1, max_nodes=1)
    backend, _ = create_backend(params)
    keyspace = backend._keyspace

    def corrupt() -> None:
        keyspace.put(keyspace.prefix + b"state", b"\x00 not a rendezvous state")

    def close() -> None:
        backend.delete_keys()
        backend.close()

    return BackendUnderTest(backend, corrupt), close


@pytest.fixture(params=["etcd-v3"])
def under_test(request, etcd_endpoint: str) -> Iterator[BackendUnderTest]:
    made, close = {"etcd-v3": _etcd_v3}[request.param](etcd_endpoint)
    try:
        yield made
    finally:
        close()


def test_no_state_is_none(under_test: BackendUnderTest) -> None:
    assert under_test.backend.get_state() is None


def test_get_state_returns_what_was_set_with_a_token(under_test: BackendUnderTest) -> None:
    under_test.backend.set_state(b"x")
    state, token = under_test.backend.get_state()
    assert state == b"x" and token is not None


def test_a_corrupt_state_raises_rendezvous_state_error(under_test: BackendUnderTest) -> None:
    under_test.corrupt()
    with pytest.raises(RendezvousStateError):
        under_test.backend.get_state()
    with pytest.raises(RendezvousStateError):  # also when handed back by a failed set
        under_test.backend.set_state(b"y", token=None)


def test_set_state_without_token_sets_only_when_absent(under_test: BackendUnderTest) -> None:
    state, token, has_set = under_test.backend.set_state(b"x")
    assert (state, has_set) == (b"x", True) and token is not None
    assert under_test.backend.set_state(b"y") == (b"x", token, False)


def test_set_state_with_the_current_token_sets(under_test: BackendUnderTest) -> None:
    _, token1, _ = under_test.backend.set_state(b"x")
    state, token2, has_set = under_test.backend.set_state(b"y", token1)
    assert (state, has_set) == (b"y", True) and token2 != token1


def test_set_state_with_an_old_token_returns_the_current_state(
        under_test: BackendUnderTest) -> None:
    _, token1, _ = under_test.backend.set_state(b"x")
    _, token2, _ = under_test.backend.set_state(b"y", token1)
    assert under_test.backend.set_state(b"z", token1) == (b"y", token2, False)


@pytest.mark.parametrize("token", ["invalid", "", -1, 3.5, b"7", object()])
def test_set_state_with_a_token_it_never_issued_returns_the_current_state(
        under_test: BackendUnderTest, token: object) -> None:
    _, current, _ = under_test.backend.set_state(b"x")
    assert under_test.backend.set_state(b"y", token) == (b"x", current, False)
    assert under_test.backend.get_state() == (b"x", current)
