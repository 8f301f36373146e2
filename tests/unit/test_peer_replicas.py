"""Peer copies of the local tier: ring order, a real replica server process, copies sent
by the uploader, restored before the store, checked against the manifest, pruned with
the tier (fsspec's in-memory store stands in for the remote one)."""

from __future__ import annotations

import os
import threading

import pytest

from elastic_train.storage import replica_server
from elastic_train.storage.checkpoint_store import list_directory
from elastic_train.storage.local_tier import LocalTier, run_group
from elastic_train.storage.peer_replicas import PeerRing, fetch, send
from elastic_train.storage.replica_server import new_key
from elastic_train.storage.restore_check import check_share
from elastic_train.storage.uploader import CheckpointUploader, UploadJob
from tests.support import replicas
from tests.support.replicas import SHARE, committed, request, signed, staged, write_files

store, tier, peer = replicas.store, replicas.tier, replicas.peer  # the fixtures


@pytest.mark.parametrize(("nodes", "copies", "node", "expected"), [
    (2, 1, 0, [1]), (2, 1, 1, [0]), (4, 1, 3, [0]), (4, 2, 2, [3, 0]),
    (3, 5, 0, [1, 2]),  # never more than the other nodes
    (1, 1, 0, []),      # alone: nobody to copy to
])
def test_successors_follow_the_ring_of_node_ranks(nodes, copies, node, expected):
    ring = PeerRing.of(node, [(n, f"http://n{n}", "") for n in range(nodes)], copies, 1)
    assert ring.successors(node) == expected


def test_holders_are_the_writers_successors_then_the_writer_never_this_node():
    gathered = [(n, f"http://n{n}", "") for n in range(4) for _ in range(2)]  # 2 ranks a node
    ring = PeerRing.of(1, gathered, 1, 2)
    assert ring.holders(writer_rank=1) == [0]  # node 0's copy would be here, on node 1
    assert ring.holders(writer_rank=5) == [3, 2]  # rank 5 is on node 2
    assert PeerRing.of(1, [(0, "", ""), (1, "u", ""), (2, "", "")], 1, 1).holders(0) == []


@pytest.mark.parametrize(("local_addr", "endpoint", "expected"), [
    ("10.0.0.5", "etcd:2379", "10.0.0.5"), (None, "127.0.0.1:29500", "127.0.0.1"),
    (None, "localhost:2379", "127.0.0.1"),
])
def test_the_server_binds_where_peers_reach_the_node(local_addr, endpoint, expected):
    assert replica_server.host_for(local_addr, endpoint) == expected


def test_sent_files_reach_the_peer_and_restore_from_it_without_the_store(
        store, tier, peer, tmp_path):
    peer_tier = peer.tier
    m = committed(store, 0, tmp_path, {0: SHARE})
    ring_0 = peer.ring()
    entry = tier.entry(store.fs, store.path(0), 0)
    tier.keep(store.fs, store.path(0), staged(tmp_path, "a"), list(SHARE), 0)
    send(ring_0, entry, m.files)
    replica = peer_tier.entry(store.fs, store.path(0), 0)
    assert list_directory(replica.kept) == sorted(SHARE)  # unchecked until used
    # Node 0's disk is wiped and the store loses the files: the peer alone has them.
    LocalTier(tier.root).prune(store.fs, store.run_path, lambda index: False)
    for rel in SHARE:
        store.fs.rm(f"{store.path(0)}/{rel}")
    assert check_share(store, m, 0, 1, LocalTier(tier.root, peers=ring_0)) == []
    for rel, data in SHARE.items():
        with open(os.path.join(entry.verified, rel), "rb") as f:
            assert f.read() == data


def test_the_uploader_sends_after_the_upload(store, tier, peer, tmp_path):
    peer_tier = peer.tier
    ring = peer.ring()
    uploader = CheckpointUploader(store, 0, str(tmp_path / "staging"),
                                  tier=LocalTier(str(tmp_path / "tier"), peers=ring))
    write_files(tmp_path / "src", SHARE)
    uploader.submit(UploadJob.plan(0, [list(SHARE)], 0), str(tmp_path / "src"))
    uploader.close()
    replica = peer_tier.entry(store.fs, store.path(0), 0)
    for rel, data in SHARE.items():
        with open(os.path.join(replica.kept, rel), "rb") as f:
            assert f.read() == data


def test_a_corrupted_copy_on_the_peer_falls_back_to_the_store(store, tier, peer, tmp_path):
    peer_tier = peer.tier
    m = committed(store, 0, tmp_path, {0: SHARE})
    replica = peer_tier.entry(store.fs, store.path(0), 0)
    write_files(replica.kept, {**SHARE, "__0_0.distcp": b"rot" + SHARE["__0_0.distcp"][3:]})
    ring = peer.ring()
    entry = tier.entry(store.fs, store.path(0), 0)
    assert fetch(ring, entry, "__0_0.distcp", m.files["__0_0.distcp"]) is None
    assert not os.path.exists(os.path.join(entry.verified, "__0_0.distcp"))
    assert check_share(store, m, 0, 1, LocalTier(tier.root, peers=ring)) == []  # the store
    with open(os.path.join(entry.verified, "__0_0.distcp"), "rb") as f:
        assert f.read() == SHARE["__0_0.distcp"]


def test_no_peer_at_all_falls_back_to_the_store(store, tier, tmp_path):
    m = committed(store, 0, tmp_path, {0: SHARE})
    ring = PeerRing.of(0, [(0, "", ""), (1, "http://127.0.0.1:9", new_key())], 1, 1)  # none
    assert check_share(store, m, 0, 1, LocalTier(tier.root, peers=ring)) == []


def test_replicas_are_pruned_with_the_tier(store, peer, tmp_path):
    peer_tier = peer.tier
    ring = peer.ring()
    for index in (0, 1):
        m = committed(store, index, tmp_path, {0: SHARE})
        src = LocalTier(str(tmp_path / "sender"))
        src.keep(store.fs, store.path(index), staged(tmp_path, str(index)), list(SHARE), index)
        send(ring, src.entry(store.fs, store.path(index), index), m.files)
    # the receiving node's own uploader supersedes as its next upload is done
    peer_tier.supersede(store.fs, store.run_path, lambda index: index == 1)
    group = os.path.dirname(peer_tier.entry(store.fs, store.path(0), 0).base)
    assert sorted(os.listdir(group)) == ["checkpoint_000001.kept"]


def test_the_server_keeps_only_matching_bodies_and_serves_only_the_tier(store, peer,
                                                                         tmp_path):
    group = run_group(store.fs, store.run_path)
    path = f"/{group}/checkpoint_000003/a.pt"
    wrong = signed(peer.key, "PUT", path, b"data", sha256="0" * 64)
    assert request(peer.url, "PUT", path, b"data", wrong)[0] == 400
    assert request(peer.url, "GET", path, headers=signed(peer.key, "GET", path))[0] == 404
    assert request(peer.url, "PUT", path, b"data", signed(peer.key, "PUT", path, b"data"))[0] \
        == 201
    assert request(peer.url, "GET", path, headers=signed(peer.key, "GET", path)) \
        == (200, b"data")
    (tmp_path / "secret").write_text("outside the tier")
    for bad in (f"/{group}/checkpoint_000003/../../../secret", "/secret",
                f"/{group}/other/a.pt"):
        assert request(peer.url, "GET", bad, headers=signed(peer.key, "GET", bad))[0] == 404
        assert request(peer.url, "PUT", bad, b"data",
                       signed(peer.key, "PUT", bad, b"data"))[0] == 403, bad
    assert not os.path.exists(tmp_path / "peer_tier" / "secret")


def test_a_whole_checkpoint_read_takes_another_nodes_files_from_that_node(
        store, tier, peer, tmp_path):
    """``Checkpoint.as_directory()`` on node 0 of a file node 1 wrote (rank 1): node 1's
    own kept copy serves it, the store is not read."""
    peer_tier = peer.tier
    m = committed(store, 0, tmp_path, {1: SHARE})
    peer_tier.keep(store.fs, store.path(0), staged(tmp_path, "own"), list(SHARE), 0)
    for rel in SHARE:
        store.fs.rm(f"{store.path(0)}/{rel}")
    ring = peer.ring()
    with LocalTier(tier.root, peers=ring).local_copy(store.fs, store.path(0), m) as d:
        with open(os.path.join(d, "__0_0.distcp"), "rb") as f:
            assert f.read() == SHARE["__0_0.distcp"]


def test_an_abandoned_upload_sends_no_more_files(store, peer, tmp_path):
    """An in-process restart abandons the uploader: its send stops before the next file."""
    peer_tier = peer.tier
    m = committed(store, 0, tmp_path, {0: SHARE})
    src = LocalTier(str(tmp_path / "sender"))
    src.keep(store.fs, store.path(0), staged(tmp_path, "x"), list(SHARE), 0)
    cancelled = threading.Event()
    cancelled.set()
    send(peer.ring(), src.entry(store.fs, store.path(0), 0),
         m.files, cancelled)
    assert not os.path.exists(peer_tier.entry(store.fs, store.path(0), 0).kept)
