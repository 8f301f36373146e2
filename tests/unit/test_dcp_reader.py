"""CheckpointReader: DCP loads that read only the byte ranges they need (one process,
``no_dist``; the multi-rank cases are in tests/e2e/test_fsdp.py)."""

from __future__ import annotations

import os
import uuid
from types import SimpleNamespace

import fsspec
import pytest
import torch
import torch.distributed.checkpoint as dcp

from elastic_train.checkpoint import Checkpoint
from elastic_train.storage import CheckpointStore, CommitManifest
from elastic_train.storage.checkpoint_store import describe_files, list_directory
from elastic_train.storage.dcp import plan_spans
from elastic_train.storage.local_tier import LocalTier
from elastic_train.torch import CheckpointReader
from tests.support.node_settings import use_node_settings


def test_plan_spans_merges_neighbours_within_the_request_size():
    def info(rel, offset, length):
        return SimpleNamespace(relative_path=rel, offset=offset, length=length)

    items = [("a1", info("a", 0, 10)), ("b1", info("b", 0, 5)), ("a2", info("a", 10, 10)),
             ("a3", info("a", 100, 10)), ("a4", info("a", 1000, 50))]
    spans = plan_spans(items, request_bytes=120, gap_bytes=100)
    assert [(s.relpath, s.start, s.end, [i for i, _ in s.items]) for s in spans] == [
        ("a", 0, 110, ["a1", "a2", "a3"]), ("a", 1000, 1050, ["a4"]), ("b", 0, 5, ["b1"])]


def state() -> dict:
    gen = torch.Generator().manual_seed(0)
    return {"big": torch.randn(64, 1024, generator=gen), "small": torch.randn(8, generator=gen),
            "step": 7}


@pytest.fixture
def stored(tmp_path):
    """A DCP checkpoint committed on fsspec's in-memory store (a 'remote' one)."""
    local = tmp_path / "saved"
    dcp.save(state(), checkpoint_id=str(local), no_dist=True)
    fs = fsspec.filesystem("memory")
    store = CheckpointStore(fs, f"/dcp-test-{uuid.uuid4().hex}")
    files = list_directory(str(local))
    store.upload(0, str(local), files)
    described = {rel: {**d, "rank": 0} for rel, d in describe_files(str(local), files).items()}
    store.commit(CommitManifest(0, 1, {}, described, 1))
    yield Checkpoint(store.path(0), fs), str(local)
    fs.rm(store.run_path, recursive=True)


def empty() -> dict:
    return {"big": torch.zeros(64, 1024), "small": torch.zeros(8), "step": 0}


def shard_bytes(local: str) -> int:
    return sum(os.path.getsize(os.path.join(local, f)) for f in os.listdir(local)
               if f.endswith(".distcp"))


def test_loads_in_place_from_a_remote_store(stored):
    checkpoint, local = stored
    loaded, reader = empty(), CheckpointReader(checkpoint, request_bytes=64 << 10)
    dcp.load(loaded, storage_reader=reader, no_dist=True)
    expected = state()
    assert torch.equal(loaded["big"], expected["big"]) and loaded["step"] == 7
    metadata = os.path.getsize(os.path.join(local, ".metadata"))
    assert metadata < reader.bytes_fetched <= metadata + shard_bytes(local)
    assert reader.bytes_local == 0


def test_fetches_only_the_ranges_it_loads(stored):
    checkpoint, local = stored
    loaded, reader = {"small": torch.zeros(8)}, CheckpointReader(checkpoint)
    dcp.load(loaded, storage_reader=reader, no_dist=True)
    assert torch.equal(loaded["small"], state()["small"])
    metadata = os.path.getsize(os.path.join(local, ".metadata"))
    assert reader.bytes_fetched - metadata < 4096 < shard_bytes(local)  # not the 256 KiB


def test_reads_the_nodes_verified_copy_instead(stored, tmp_path, monkeypatch):
    checkpoint, local = stored
    use_node_settings(monkeypatch, tier_root=str(tmp_path / "tier"))
    tier = LocalTier.of_node()
    tier.keep(checkpoint.filesystem, checkpoint.path, local, list_directory(local))
    loaded, reader = empty(), CheckpointReader(checkpoint)
    dcp.load(loaded, storage_reader=reader, no_dist=True)
    assert torch.equal(loaded["big"], state()["big"])
    assert reader.bytes_fetched == 0 and reader.bytes_local > shard_bytes(local)


def test_a_kept_copy_that_does_not_match_is_not_read(stored, tmp_path, monkeypatch):
    checkpoint, local = stored
    use_node_settings(monkeypatch, tier_root=str(tmp_path / "tier"))
    shard = next(f for f in os.listdir(local) if f.endswith(".distcp"))
    with open(os.path.join(local, shard), "r+b") as f:
        f.seek(-8, os.SEEK_END)
        f.write(b"\0" * 8)
    LocalTier.of_node().keep(checkpoint.filesystem, checkpoint.path, local, [shard])
    loaded, reader = empty(), CheckpointReader(checkpoint)
    dcp.load(loaded, storage_reader=reader, no_dist=True)
    assert torch.equal(loaded["big"], state()["big"]) and reader.bytes_local == 0


def test_reads_local_checkpoints_in_place(tmp_path):
    dcp.save(state(), checkpoint_id=str(tmp_path), no_dist=True)
    loaded, reader = empty(), CheckpointReader(Checkpoint(str(tmp_path)))
    dcp.load(loaded, storage_reader=reader, no_dist=True)
    assert torch.equal(loaded["small"], state()["small"]) and reader.bytes_fetched == 0
