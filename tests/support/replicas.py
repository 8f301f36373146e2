"""The node's local tier and its peer copies in the unit tests: checkpoints committed to an
in-memory store (fsspec's standing in for the remote one), node 0's tier, node 1's replica
server as a real process, and signed requests to it. The fixtures ``store``, ``tier`` and
``peer`` are used by binding them in the test module (``store = replicas.store``)."""

from __future__ import annotations

import hashlib
import http.client
import os
import urllib.parse
import uuid
from dataclasses import dataclass

import fsspec
import pytest

from elastic_train.storage import CheckpointStore, CommitManifest, replica_server
from elastic_train.storage.checkpoint_store import describe_files
from elastic_train.storage.local_tier import LocalTier, run_group
from elastic_train.storage.peer_replicas import PeerRing
from elastic_train.storage.replica_server import AUTH_HEADER, SHA256_HEADER, new_key, signature
from tests.support.node_settings import use_node_settings


def write_files(directory, files: dict[str, bytes]) -> None:
    """``files`` (path relative to ``directory``: content) written under ``directory``."""
    for rel, data in files.items():
        path = os.path.join(directory, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)


def committed(store, index, tmp_path, by_rank: dict[int, dict[str, bytes]]) -> CommitManifest:
    """Checkpoint ``index`` uploaded and committed, its files written by the given ranks."""
    files = {}
    for rank, contents in by_rank.items():
        src = tmp_path / f"src{index}.{rank}"
        write_files(src, contents)
        store.upload(index, str(src), list(contents))
        files.update({rel: {**info, "rank": rank}
                      for rel, info in describe_files(str(src), list(contents)).items()})
    manifest = CommitManifest(index, index, {}, files, world_size=len(by_rank))
    store.commit(manifest)
    return manifest


@pytest.fixture
def store():
    """A run in fsspec's in-memory store, removed afterwards."""
    fs = fsspec.filesystem("memory")
    run = f"/peer-test-{uuid.uuid4().hex}/run"
    yield CheckpointStore(fs, run)
    if fs.exists(run):
        fs.rm(run, recursive=True)


@dataclass(frozen=True)
class Peer:
    """Node 1: its tier, its replica server's URL and key."""

    tier: LocalTier
    url: str
    key: str

    def ring(self, node: int = 0) -> PeerRing:
        """The ring of node 0 (no server) and this node, as ``node`` sees it."""
        return PeerRing.of(node, [(0, "", ""), (1, self.url, self.key)], 1, 1)


@pytest.fixture
def peer(tmp_path, store):
    """Node 1: a replica server (its own process) on a tier of its own, serving ``store``'s
    run."""
    root, key = str(tmp_path / "peer_tier"), new_key()
    settings = replica_server.ServerSettings(root, "127.0.0.1",
                                             run_group(store.fs, store.run_path))
    proc, url = replica_server.start(settings, key)
    yield Peer(LocalTier(root), url, key)
    replica_server.stop(proc)


@pytest.fixture
def tier(tmp_path, monkeypatch):
    """Node 0's tier, as its workers see it."""
    use_node_settings(monkeypatch, tier_root=str(tmp_path / "tier"))
    return LocalTier.of_node()


# One rank's share of a checkpoint: a shard and a nested file.
SHARE = {"__0_0.distcp": os.urandom(300_000), "nested/extra.pt": b"x" * 1000}


def staged(tmp_path, name) -> str:
    """A directory ``staged-<name>`` under ``tmp_path`` holding :data:`SHARE`."""
    directory = tmp_path / f"staged-{name}"
    write_files(directory, SHARE)
    return str(directory)


def request(url, method, path, body=b"", headers=None):
    """One request on a connection of its own: the status and body."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def signed(key, method, path, body=b"", sha256=None):
    """The headers of a request signed with ``key`` (a PUT's with the body's SHA-256)."""
    if method == "GET":
        return {AUTH_HEADER: signature(key, method, path)}
    sha256 = sha256 or hashlib.sha256(body).hexdigest()
    return {SHA256_HEADER: sha256,
            AUTH_HEADER: signature(key, method, path, len(body), sha256)}
