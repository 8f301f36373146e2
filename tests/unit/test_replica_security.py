"""The replica port against someone on the job's network: a real replica server process
(``replica_server.start``), requests without the node's key, forged copies that match
the CRC-32, PUTs of what the tier would never prune, idle-connection floods, a hostile
server, symbolic links in the tier, TLS (fsspec's in-memory store stands in for the
remote one)."""

from __future__ import annotations

import hashlib
import http.client
import os
import resource
import socket
import ssl
import threading
import time
import urllib.parse

import pytest

from elastic_train.errors import ConfigError
from elastic_train.storage import local_tier, replica_server
from elastic_train.storage.local_tier import LocalTier, run_group
from elastic_train.storage.peer_replicas import PeerRing, fetch, send
from elastic_train.storage.replica_server import NodeReplica, ReplicaTLS, new_key
from elastic_train.storage.restore_check import check_share
from tests.support import replicas
from tests.support.etcd_server import TLSFiles
from tests.support.peer_faults import forge_crc, put
from tests.support.replicas import SHARE, Peer, committed, request, signed, staged, write_files
from tests.support.servers import idle_connections

pytestmark = pytest.mark.timeout(60)
store, tier, peer = replicas.store, replicas.tier, replicas.peer  # the fixtures

MODEL = "__0_0.distcp"


def _path(store, rel: str, index: int = 0) -> str:
    name = urllib.parse.quote(rel)
    return f"/{run_group(store.fs, store.run_path)}/checkpoint_{index:06d}/{name}"


def test_requests_without_the_nodes_key_get_401_and_nothing_else(store, peer, tmp_path):
    m = committed(store, 0, tmp_path, {0: SHARE})
    peer.tier.keep(store.fs, store.path(0), staged(tmp_path, "p"), list(SHARE), 0)
    path = _path(store, MODEL)
    assert request(peer.url, "GET", path, headers=signed(peer.key, "GET", path))[0] == 200
    other = new_key()
    for headers in ({}, signed(other, "GET", path), {"X-Replica-Auth": "0" * 64},
                    signed(peer.key, "GET", _path(store, "nested/extra.pt"))):
        assert request(peer.url, "GET", path, headers=headers) == (401, b""), headers
    forged = forge_crc(SHARE[MODEL])
    assert put(peer.url, None, path, forged) == 401
    assert put(peer.url, other, path, forged) == 401
    for verb in ("POST", "DELETE", "HEAD"):
        assert request(peer.url, verb, path)[0] in (401, 501)
    replica = peer.tier.entry(store.fs, store.path(0), 0)
    with open(os.path.join(replica.kept, MODEL), "rb") as f:
        assert f.read() == SHARE[MODEL]
    assert m.files[MODEL]["sha256"] == hashlib.sha256(SHARE[MODEL]).hexdigest()


def test_a_kept_copy_forged_to_match_the_crc_is_not_restored(store, tier, tmp_path):
    """Item 2: same size and CRC-32, other bytes: the SHA-256 catches it, the node
    downloads the file again."""
    m = committed(store, 0, tmp_path, {0: SHARE})
    entry = tier.entry(store.fs, store.path(0), 0)
    write_files(entry.kept, {**SHARE, MODEL: forge_crc(SHARE[MODEL])})
    assert check_share(store, m, 0, 1, tier) == []
    with open(os.path.join(entry.verified, MODEL), "rb") as f:
        assert f.read() == SHARE[MODEL]


def test_a_peer_copy_forged_to_match_the_crc_falls_back_to_the_store(store, tier, peer,
                                                                      tmp_path):
    m = committed(store, 0, tmp_path, {0: SHARE})
    path = _path(store, MODEL)
    assert put(peer.url, peer.key, path, forge_crc(SHARE[MODEL])) == 201  # a bad peer
    entry = tier.entry(store.fs, store.path(0), 0)
    assert fetch(peer.ring(), entry, MODEL, m.files[MODEL]) is None
    assert check_share(store, m, 0, 1, LocalTier(tier.root, peers=peer.ring())) == []
    with open(os.path.join(entry.verified, MODEL), "rb") as f:
        assert f.read() == SHARE[MODEL]


def test_a_manifest_with_crc32s_only_restores_from_the_store(store, tier, peer, tmp_path):
    """An older marker: neither a kept copy nor a peer's is trusted, the store's is."""
    m = committed(store, 0, tmp_path, {0: SHARE})
    for info in m.files.values():
        del info["sha256"]
    entry = tier.entry(store.fs, store.path(0), 0)
    write_files(entry.kept, {**SHARE, MODEL: forge_crc(SHARE[MODEL])})
    assert put(peer.url, peer.key, _path(store, MODEL), forge_crc(SHARE[MODEL])) == 201
    assert check_share(store, m, 0, 1, LocalTier(tier.root, peers=peer.ring())) == []
    with open(os.path.join(entry.verified, MODEL), "rb") as f:
        assert f.read() == SHARE[MODEL]


def test_a_put_between_the_check_and_the_move_stays_unchecked(store, tier, peer, tmp_path,
                                                              monkeypatch):
    """Item 6: a PUT that replaces the node's kept file right after the node checked it
    must not become the verified file (the node's own server, the peer here)."""
    m = committed(store, 0, tmp_path, {0: SHARE})
    own = peer.tier
    own.keep(store.fs, store.path(0), staged(tmp_path, "own"), list(SHARE), 0)
    entry = own.entry(store.fs, store.path(0), 0)
    real = local_tier.file_matches

    def checked_then_replaced(path, info):
        good = real(path, info)
        assert put(peer.url, peer.key, _path(store, MODEL), forge_crc(SHARE[MODEL])) == 201
        return good

    monkeypatch.setattr(local_tier, "file_matches", checked_then_replaced)
    verified = own.local_file(entry, MODEL, m.files[MODEL])
    with open(verified, "rb") as f:
        assert f.read() == SHARE[MODEL]


def test_puts_of_what_the_tier_never_prunes_are_refused(store, peer, tmp_path):
    """Item 4: another run group, a checkpoint name the tier does not spell, a size or
    digest other than signed: refused, and nothing is written."""
    data = b"x" * 100
    group = run_group(store.fs, store.run_path)
    for path in (f"/{group}/checkpoint_0000001/a.pt", f"/{'f' * 16}/checkpoint_000001/a.pt",
                 f"/{group}/epoch_1/a.pt", f"/{group}/checkpoint_000001.kept/a.pt"):
        assert put(peer.url, peer.key, path, data) in (403, 404), path
    path = _path(store, "a.pt", 1)
    headers = signed(peer.key, "PUT", path, data)
    assert request(peer.url, "PUT", path, data + b"more", headers)[0] == 401  # size signed
    wrong = signed(peer.key, "PUT", path, data, sha256="1" * 64)
    assert request(peer.url, "PUT", path, data, wrong)[0] == 400
    assert not any(files for _, _, files in os.walk(peer.tier.root))
    assert put(peer.url, peer.key, path, data) == 201


def test_a_name_that_needs_quoting_is_sent_and_fetched_as_itself(store, tier, peer, tmp_path):
    """Item 5: ``my model.pt`` is stored under its own name on the peer and served back."""
    share = {"my model.pt": b"weights" * 1000, "dir with space/100%.pt": b"z" * 10}
    m = committed(store, 0, tmp_path, {0: share})
    src = LocalTier(str(tmp_path / "sender"))
    staged = tmp_path / "staged-q"
    write_files(staged, share)
    src.keep(store.fs, store.path(0), str(staged), list(share), 0)
    send(peer.ring(), src.entry(store.fs, store.path(0), 0), m.files)
    replica = peer.tier.entry(store.fs, store.path(0), 0)
    assert sorted(os.listdir(replica.kept)) == ["dir with space", "my model.pt"]
    entry = tier.entry(store.fs, store.path(0), 0)
    for rel in share:
        assert fetch(peer.ring(), entry, rel, m.files[rel]) is not None, rel


def test_a_symlink_in_the_tier_is_refused_and_the_connection_goes_on(store, peer, tmp_path):
    """Item 6: a link under ``.kept`` (to a file outside the tier, or inside it) is a 404
    on a connection that still serves the next request."""
    committed(store, 0, tmp_path, {0: SHARE})
    peer.tier.keep(store.fs, store.path(0), staged(tmp_path, "p"), list(SHARE), 0)
    replica = peer.tier.entry(store.fs, store.path(0), 0)
    (tmp_path / "outside").write_text("not the tier's")
    os.symlink(tmp_path / "outside", os.path.join(replica.kept, "out.pt"))
    os.symlink(os.path.join(replica.kept, MODEL), os.path.join(replica.kept, "in.pt"))
    parts = urllib.parse.urlsplit(peer.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        for rel, status in (("out.pt", 404), ("in.pt", 404), (MODEL, 200)):
            path = _path(store, rel)
            conn.request("GET", path, headers=signed(peer.key, "GET", path))
            response = conn.getresponse()
            assert (rel, response.status) == (rel, status)
            response.read()
    finally:
        conn.close()
    path = _path(store, "out.pt")
    assert put(peer.url, peer.key, path, b"x") == 403
    assert (tmp_path / "outside").read_text() == "not the tier's"


class _EndlessServer:
    """A hostile peer: answers every GET with 200 and endless bytes (``length``: the
    Content-Length it claims, None for a body that ends when the connection does);
    counts what it sent."""

    def __init__(self, length: int | None):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.length, self.sent = length, 0
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            conn.recv(65536)
            header = "HTTP/1.1 200 OK\r\n" + (
                f"Content-Length: {self.length}\r\n" if self.length is not None else
                "Connection: close\r\n") + "\r\n"
            conn.sendall(header.encode())
            chunk = b"\0" * (1 << 20)
            try:
                while self.sent < 2 << 30:
                    conn.sendall(chunk)
                    self.sent += len(chunk)
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize("length", [None, 1 << 40])
def test_a_peer_that_sends_too_much_fills_no_disk(store, tier, tmp_path, length):
    """Item 6: the client reads at most the manifest's size (and one byte more)."""
    m = committed(store, 0, tmp_path, {0: SHARE})
    hostile = _EndlessServer(length)
    try:
        ring = PeerRing.of(0, [(0, "", ""), (1, hostile.url, new_key())], 1, 1)
        entry = tier.entry(store.fs, store.path(0), 0)
        assert fetch(ring, entry, MODEL, m.files[MODEL]) is None
        assert hostile.sent < 64 << 20, hostile.sent  # not the 2 GiB it had to send
        assert not os.path.exists(entry.verified) or os.listdir(entry.verified) == []
    finally:
        hostile.close()


def test_idle_connections_neither_exhaust_the_server_nor_delay_a_peer(store, peer, tmp_path):
    """Item 3: 300 idle connections (a half-sent request on one) against a server that
    may hold 128 descriptors; a signed GET still answers at once, and the idle ones are
    closed by the server within its auth timeout."""
    committed(store, 0, tmp_path, {0: SHARE})
    peer.tier.keep(store.fs, store.path(0), staged(tmp_path, "p"), list(SHARE), 0)
    pid = _server_pid(peer)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (128, 128))
    parts = urllib.parse.urlsplit(peer.url)
    flood = idle_connections(parts.hostname, parts.port, 300)
    flood[-1].sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # and never the rest
    try:
        path = _path(store, MODEL)
        started = time.monotonic()
        assert request(peer.url, "GET", path, headers=signed(peer.key, "GET", path)) \
            == (200, SHARE[MODEL])
        assert time.monotonic() - started < 3.0
        last = flood[-1]
        last.settimeout(replica_server.Limits().admit_timeout_s + 5)
        assert last.recv(1) == b""  # closed by the server
    finally:
        for sock in flood:
            sock.close()


def _server_pid(node: Peer) -> int:
    port = urllib.parse.urlsplit(node.url).port
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and int(fields[1].split(":")[1], 16) == port:
            inode = fields[9]
            break
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        if f"socket:[{inode}]" in links:
            return int(pid)
    raise AssertionError("no process listens on the replica port")


@pytest.fixture
def tls_files(tmp_path):
    return TLSFiles.make(str(tmp_path))


def test_tls_with_the_jobs_certificates(store, tier, tmp_path, tls_files):
    """Item 1: given certificates, the server speaks TLS only, asks for the peer's
    certificate, and send and fetch work over it."""
    tls = ReplicaTLS(tls_files.server_cert, tls_files.server_key, tls_files.ca)
    root, key = str(tmp_path / "peer_tier"), new_key()
    settings = replica_server.ServerSettings(root, "127.0.0.1",
                                             run_group(store.fs, store.run_path), tls)
    proc, url = replica_server.start(settings, key)
    try:
        assert url.startswith("https://")
        m = committed(store, 0, tmp_path, {0: SHARE})
        ring = PeerRing.of(0, [(0, "", ""), (1, url, key)], 1, 1, tls)
        src = LocalTier(str(tmp_path / "sender"))
        src.keep(store.fs, store.path(0), staged(tmp_path, "t"), list(SHARE), 0)
        send(ring, src.entry(store.fs, store.path(0), 0), m.files)
        entry = tier.entry(store.fs, store.path(0), 0)
        assert fetch(ring, entry, MODEL, m.files[MODEL]) is not None
        parts = urllib.parse.urlsplit(url)
        with pytest.raises((OSError, http.client.HTTPException)):  # plain HTTP: no answer
            request(url.replace("https", "http"), "GET", "/")
        no_cert = ssl.create_default_context(cafile=tls_files.ca)
        conn = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=10,
                                           context=no_cert)
        with pytest.raises((ssl.SSLError, OSError)):  # no client certificate: refused
            conn.request("GET", "/")
            conn.getresponse()
        conn.close()
    finally:
        replica_server.stop(proc)


def test_the_worker_plan_carries_the_key_and_tls_back(tmp_path, tls_files):
    from elastic_train.config import CheckpointConfig
    from elastic_train.worker import worker_plan

    tls = ReplicaTLS(tls_files.client_cert, tls_files.client_key, tls_files.ca)
    plan = worker_plan.WorkerPlan("r", CheckpointConfig(), "s", "t", True, 1.0, None, (),
                                  NodeReplica("http://h:1", new_key(), tls))
    path = plan.write(str(tmp_path))[worker_plan.env_vars.PLAN]
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert worker_plan._read(path) == plan


def test_tls_files_are_all_given_and_exist_or_the_job_stops_before_it_starts(tls_files):
    given = {"replica_cert": tls_files.server_cert, "replica_key": tls_files.server_key,
             "replica_ca_cert": tls_files.ca}
    assert ReplicaTLS.from_conf({"join_timeout": 5}) is None
    assert ReplicaTLS.from_conf(given) == ReplicaTLS(*given.values())
    with pytest.raises(ConfigError, match="give all three"):
        ReplicaTLS.from_conf({**given, "replica_ca_cert": ""})
    with pytest.raises(ConfigError, match="replica_key=/nowhere.key: no such file"):
        ReplicaTLS.from_conf({**given, "replica_key": "/nowhere.key"})
