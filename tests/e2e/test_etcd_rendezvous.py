"""The etcd v3 rendezvous backend and store against a real etcd server (no v2 API).

Skipped when the ``etcd`` binary (Debian: etcd-server) or ``etcd3gw`` is missing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch.distributed as dist
from torch.distributed.elastic.rendezvous import (
    RendezvousConnectionError,
    RendezvousInfo,
    RendezvousParameters,
)
from torch.distributed.elastic.rendezvous.registry import (
    get_rendezvous_handler,
    handler_registry,
)

from tests.conftest import wait_until
from tests.support.etcd_server import EtcdServer
from tests.support.paths import REPO

pytest.importorskip("etcd3gw", reason="etcd3gw is not installed (pip install etcd3gw)")

from elastic_train._internal.rendezvous_backends import lookup  # noqa: E402
from elastic_train.agent.rendezvous.etcd_handler import create_etcd_v3_handler  # noqa: E402
from elastic_train.agent.rendezvous.etcd_v3 import (  # noqa: E402
    EtcdV3RendezvousBackend,
    EtcdV3Store,
    create_backend,
)
from elastic_train.agent.rendezvous.registry import register as register_backend  # noqa: E402


def register() -> None:
    """Our etcd handlers into torch's registry: "etcd" (native) and "etcd-v3"."""
    for name in ("etcd", "etcd-v3"):
        register_backend(lookup(name, "test"))


def _params(endpoint: str, run_id: str | None = None, **config: object) -> RendezvousParameters:
    return RendezvousParameters(
        backend="etcd-v3", endpoint=endpoint, run_id=run_id or uuid.uuid4().hex,
        min_nodes=1, max_nodes=1, **config,
    )


@pytest.fixture
def backend_and_store(etcd_endpoint: str) -> Iterator[tuple[EtcdV3RendezvousBackend, EtcdV3Store]]:
    """A backend and store on a fresh run id; closed and their keys deleted afterwards."""
    backend, store = create_backend(_params(etcd_endpoint))
    yield backend, store
    backend.delete_keys()
    backend.close()


@pytest.mark.timeout(60)
def test_etcd_runs_without_the_v2_api(etcd_server: EtcdServer) -> None:
    assert not any(arg.startswith("--enable-v2") for arg in etcd_server.args)
    assert etcd_server.get("/v2/keys")[0] == 404
    assert etcd_server.get("/version")[0] == 200


@pytest.mark.timeout(60)
def test_register_is_idempotent_and_import_registers_nothing() -> None:
    """Importing leaves torch's own "etcd" alone; "etcd-v3" comes only from the installed
    package's torchrun.handlers entry point, which torch itself loads; register() puts
    our native handler under "etcd" and torch's dynamic one over etcd under "etcd-v3"."""
    probe = (
        "import elastic_train.agent.rendezvous.etcd_handler as r\n"
        "from elastic_train._internal.rendezvous_backends import lookup\n"
        "from elastic_train.agent.rendezvous.registry import register\n"
        "from torch.distributed.elastic.rendezvous.registry import handler_registry as h\n"
        "assert h._registry.get('etcd-v3', r.create_etcd_v3_handler) is "
        "r.create_etcd_v3_handler\n"
        "assert h._registry['etcd'] is not r.create_etcd_v3_handler\n"
        "import elastic_train.agent.rendezvous.etcd_native as n\n"
        "for name in ('etcd', 'etcd-v3'): register(lookup(name, 'test'))\n"
        "register(lookup('etcd', 'test'))\n"
        "assert h._registry['etcd-v3'] is r.create_etcd_v3_handler\n"
        "assert h._registry['etcd'] is n.create_handler\n"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=50)
    register()
    register()
    assert handler_registry._registry["etcd-v3"] is create_etcd_v3_handler


@pytest.mark.timeout(60)
def test_empty_run_has_no_state(backend_and_store) -> None:
    backend, _ = backend_and_store
    assert backend.name == "etcd-v3"
    assert backend.get_state() is None


@pytest.mark.timeout(60)
def test_set_state_is_compare_and_set_on_the_token(backend_and_store) -> None:
    backend, _ = backend_and_store
    state, token, ok = backend.set_state(b"\x00first\xff", None)
    assert (state, ok) == (b"\x00first\xff", True)
    assert backend.get_state() == (b"\x00first\xff", token)

    # Token None creates only if absent: the existing state and its token come back.
    assert backend.set_state(b"other", None) == (b"\x00first\xff", token, False)

    state2, token2, ok = backend.set_state(b"second", token)
    assert (state2, ok) == (b"second", True) and token2 != token

    # A stale token fails and returns the current state with its (new) token.
    assert backend.set_state(b"stale", token) == (b"second", token2, False)
    assert backend.get_state() == (b"second", token2)


@pytest.mark.timeout(60)
def test_runs_do_not_see_each_other(etcd_endpoint: str) -> None:
    a, _ = create_backend(_params(etcd_endpoint, "job/a"))
    b, _ = create_backend(_params(etcd_endpoint, "job"))
    try:
        a.set_state(b"a-state")
        assert b.get_state() is None
        b.set_state(b"b-state")
        b.delete_keys()
        assert a.get_state() is not None and a.get_state()[0] == b"a-state"
        assert b.get_state() is None
    finally:
        for backend in (a, b):
            backend.delete_keys()
            backend.close()


@pytest.mark.timeout(60)
def test_lease_lives_while_any_node_does(etcd_endpoint: str) -> None:
    run_id = uuid.uuid4().hex
    first, _ = create_backend(_params(etcd_endpoint, run_id, lease_ttl=2))
    second, _ = create_backend(_params(etcd_endpoint, run_id, lease_ttl=2))
    first.set_state(b"state")
    time.sleep(5)  # over two TTLs: the keep-alive threads refreshed the lease
    assert first.get_state() is not None
    first.close()
    time.sleep(5)  # the second node keeps the shared lease alive
    assert second.get_state() is not None
    second.close()
    assert wait_until(lambda: second.get_state() is None, 15), "keys outlived the lease"


@pytest.mark.timeout(60)
def test_delete_keys_removes_state_and_store(backend_and_store) -> None:
    backend, store = backend_and_store
    backend.set_state(b"state")
    store.set("key", "value")
    backend.delete_keys()
    assert backend.get_state() is None
    assert not store.check(["key"])


@pytest.mark.timeout(60)
def test_store_set_get_check_wait_delete(backend_and_store) -> None:
    _, store = backend_and_store
    store.set("bin", b"\x00\x01\xfe\xff")
    store.set("text", "héllo")
    assert store.get("bin") == b"\x00\x01\xfe\xff"
    assert store.get("text") == "héllo".encode()
    assert store.check(["bin", "text"]) and not store.check(["bin", "nope"])
    store.wait(["bin", "text"])

    threading.Timer(0.5, store.set, ("late", b"here")).start()
    assert store.get("late") == b"here"  # blocks until the timer sets it

    assert store.delete_key("bin") and not store.delete_key("bin")
    assert not store.check(["bin"])


@pytest.mark.timeout(60)
def test_store_timeouts_raise(backend_and_store) -> None:
    _, store = backend_and_store
    store.set_timeout(timedelta(seconds=0.5))
    start = time.monotonic()
    with pytest.raises(dist.DistStoreError):
        store.get("missing")
    with pytest.raises(dist.DistStoreError):
        store.wait(["missing"], timedelta(seconds=0.3))
    assert time.monotonic() - start < 3


@pytest.mark.timeout(60)
def test_store_add_is_atomic(backend_and_store) -> None:
    _, store = backend_and_store
    assert store.add("n", 5) == 5

    def bump() -> None:
        for _ in range(15):
            store.add("n", 1)

    threads = [threading.Thread(target=bump) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert store.add("n", 0) == 50
    assert store.get("n") == b"50"


@pytest.mark.timeout(60)
def test_store_compare_set(backend_and_store) -> None:
    _, store = backend_and_store
    assert store.compare_set("k", "x", "y") == b"x"  # absent, non-empty expected: not set
    assert not store.check(["k"])
    assert store.compare_set("k", "", "v1") == b"v1"  # absent, empty expected: set
    assert store.compare_set("k", "wrong", "v2") == b"v1"  # mismatch: current value
    assert store.compare_set("k", "v1", b"v2") == b"v2"
    assert store.get("k") == b"v2"

    # Through torch's PrefixStore, as the handler uses it; c10d's append is built on compare_set.
    prefixed = dist.PrefixStore("round.0", store)
    prefixed.set("empty", b"")
    assert prefixed.compare_set("empty", "", "filled") == b"filled"
    prefixed.append("log", "a")
    prefixed.append("log", "b")
    assert prefixed.get("log") == b"ab"
    assert prefixed.add("count", 2) == 2 and prefixed.check(["count"])


@pytest.mark.compat
@pytest.mark.timeout(60)
def test_two_handlers_rendezvous_through_torchs_registry(etcd_endpoint: str) -> None:
    register()
    run_id = uuid.uuid4().hex
    params = [
        RendezvousParameters(
            backend="etcd-v3", endpoint=etcd_endpoint, run_id=run_id, min_nodes=2, max_nodes=2,
            local_addr="127.0.0.1", join_timeout=30, last_call_timeout=1, lease_ttl=5,
        )
        for _ in range(2)
    ]
    handlers = [get_rendezvous_handler(p) for p in params]
    infos: list[RendezvousInfo | None] = [None, None]
    errors: list[BaseException] = []

    def join(i: int) -> None:
        try:
            infos[i] = handlers[i].next_rendezvous()
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=join, args=(i,)) for i in range(2)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(45)
        assert not errors, errors
        assert all(info is not None for info in infos)
        assert {info.rank for info in infos} == {0, 1}
        assert {info.world_size for info in infos} == {2}
        assert all(handler.get_backend() == "etcd-v3" for handler in handlers)
        # The round's store is our etcd store behind torch's PrefixStore.
        infos[0].store.set("hello", b"from rank 0")
        assert infos[1].store.get("hello") == b"from rank 0"
    finally:
        for handler in handlers:
            assert handler.shutdown()
    assert handlers[0].is_closed()
    lease_threads = [t for t in threading.enumerate() if t.name == f"etcd-lease-{run_id}"]
    assert not lease_threads, "shutdown did not stop the lease keep-alive"
    cleanup, _ = create_backend(params[0])
    cleanup.delete_keys()
    cleanup.close()


@pytest.mark.timeout(60)
def test_etcd_name_is_our_native_handler(etcd_endpoint: str) -> None:
    from elastic_train.agent.rendezvous.etcd_native import EtcdNativeHandler

    register()
    params = RendezvousParameters(
        backend="etcd", endpoint=etcd_endpoint, run_id=uuid.uuid4().hex, min_nodes=1, max_nodes=1,
    )
    handler = get_rendezvous_handler(params)
    try:
        assert isinstance(handler, EtcdNativeHandler)
        assert handler.get_backend() == "etcd"
        assert handler.num_nodes_waiting() == 0
    finally:
        handler.shutdown()


def _gateway(url: str, path: str, body: dict, token: str | None = None) -> dict:
    request = urllib.request.Request(
        url + "/v3/" + path, data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": token} if token else {},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


@pytest.mark.timeout(60)
def test_username_and_password(etcd_server: EtcdServer) -> None:
    server = EtcdServer(etcd_server.binary)  # auth stays off on the shared server
    try:
        server.start()
        _gateway(server.url, "auth/user/add", {"name": "root", "password": "s3cret"})
        _gateway(server.url, "auth/user/grant", {"user": "root", "role": "root"})
        _gateway(server.url, "auth/enable", {})

        with pytest.raises(RendezvousConnectionError) as denied:
            create_backend(_params(server.endpoint, username="root", password="wrong"))
        assert "wrong" not in str(denied.value)
        anonymous, _ = create_backend(_params(server.endpoint))  # leases need no auth on 3.4
        try:
            with pytest.raises(RendezvousConnectionError):
                anonymous.set_state(b"state")
        finally:
            anonymous.close()

        params = _params(server.endpoint, username="root", password="s3cret")
        backend, store = create_backend(params)
        try:
            assert backend.set_state(b"state")[2]
            store.set("k", b"v")
            assert store.get("k") == b"v"
            backend._keyspace.client.session._token = "expired"  # etcd answers 401: log in again
            assert backend.get_state() is not None
        finally:
            backend.close()
    finally:
        server.stop()


@pytest.mark.compat
@pytest.mark.timeout(120)
def test_plain_torchrun_finds_the_backend_through_its_entry_point(etcd_endpoint: str) -> None:
    """The installed package's ``torchrun.handlers`` entry point: torchrun itself, not
    elastic-train launch, runs two workers over an etcd v3 rendezvous."""
    repo = REPO
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
         "--nproc-per-node", "2", "--rdzv-backend", "etcd-v3", "--rdzv-endpoint",
         etcd_endpoint, "--rdzv-id", f"torchrun-{uuid.uuid4().hex[:8]}",
         "tests/e2e/scripts/plain_torchrun_script.py"],
        cwd=repo, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("sum=2 missing=[]") == 2


@pytest.fixture
def own_etcd(etcd_server: EtcdServer) -> Iterator[EtcdServer]:
    """An etcd server of this test alone (the shared one must stay up and without auth)."""
    server = EtcdServer(etcd_server.binary)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.mark.timeout(90)
def test_a_restarting_etcd_is_waited_for(own_etcd: EtcdServer) -> None:
    """etcd SIGKILLed and started again on its data 2 s later: calls made meanwhile
    (torch's agent polls the backend every monitor interval) wait instead of failing,
    and the state written before the crash is still there."""
    backend, store = create_backend(_params(own_etcd.endpoint, outage_timeout=20))
    try:
        _, token, _ = backend.set_state(b"before")
        own_etcd.kill()
        threading.Timer(2.0, own_etcd.start).start()
        started = time.monotonic()
        state, after = backend.get_state()
        assert state == b"before" and after == token
        assert time.monotonic() - started >= 1.5
        store.set("k", b"v")
        assert store.get("k") == b"v"
    finally:
        backend.close()


@pytest.mark.timeout(60)
def test_an_etcd_that_stays_down_fails_after_the_outage_timeout(own_etcd: EtcdServer) -> None:
    backend, _ = create_backend(_params(own_etcd.endpoint, outage_timeout=3))
    try:
        own_etcd.kill()
        started = time.monotonic()
        with pytest.raises(RendezvousConnectionError):
            backend.get_state()
        assert 2 <= time.monotonic() - started < 20
    finally:
        backend.close()


@pytest.mark.timeout(60)
def test_a_node_granting_the_run_lease_at_the_same_time_as_another(
        etcd_of_each_major: EtcdServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Node A finds no lease for the run, node B grants it, then A's grant of the same id
    is refused ("lease already exists": HTTP 412 from etcd 3.4's gateway, 400 from
    3.5's); A must then use B's lease instead of failing to join."""
    from etcd3gw.lease import Lease

    refresh = Lease.refresh
    raced: list[int] = []

    def refresh_then_another_node_grants(lease: Lease) -> int:
        ttl = refresh(lease)
        if ttl <= 0 and not raced:
            raced.append(lease.id)
            _gateway(etcd_of_each_major.url, "lease/grant", {"ID": lease.id, "TTL": 10})
        return ttl

    monkeypatch.setattr(Lease, "refresh", refresh_then_another_node_grants)
    backend, store = create_backend(_params(etcd_of_each_major.endpoint))
    try:
        assert raced, "the race was not staged"
        assert backend.set_state(b"state")[2]
        store.set("k", b"v")
        assert store.get("k") == b"v"
    finally:
        backend.close()
