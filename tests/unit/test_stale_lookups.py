"""Commit markers behind a stale negative lookup (an NFS client's cached "not found"):
the checkpoint is neither deleted as uncommitted nor skipped as missing."""

from __future__ import annotations

import json
import os

import pytest

from elastic_train.storage import RunStorage
from elastic_train.storage.checkpoint_store import MARKER
from tests.support.stale_fs import NODE_ENV, NodeCacheFS


@pytest.fixture
def stale(tmp_path, monkeypatch):
    """A run directory on local disk seen by node "a", whose negative lookups stay 30 s."""
    monkeypatch.setenv(NODE_ENV, "a")
    fs = NodeCacheFS(str(tmp_path / "cache"), negative_ttl_s=30.0, skip_instance_cache=True)
    return RunStorage(fs, str(tmp_path / "run"))


def _commit_elsewhere(storage: RunStorage, index: int) -> None:
    """What another node's rank 0 does: write the files and, last, the marker."""
    path = storage.checkpoints.path(index)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "state.pt"), "wb") as f:
        f.write(b"weights")
    manifest = {"index": index, "training_iteration": index + 1, "metrics": {}, "world_size": 1,
                "files": {"state.pt": {"size": 7, "crc32": "00000000"}}}
    with open(os.path.join(path, MARKER), "w") as f:
        json.dump(manifest, f)


def test_a_marker_cached_as_missing_is_revalidated_before_anything_is_deleted(stale):
    os.makedirs(stale.checkpoints.path(3))
    marker = os.path.join(stale.checkpoints.path(3), MARKER)
    assert not stale.fs.exists(marker)  # a lookup by this node: "not found" is cached
    _commit_elsewhere(stale, 3)
    assert not stale.fs.exists(marker)  # still, for 30 s: the stale negative lookup
    assert stale.checkpoints.remove_uncommitted() == []
    assert [m.index for m in stale.checkpoints.committed()] == [3]


def test_a_directory_without_a_marker_is_still_removed(stale):
    _commit_elsewhere(stale, 0)
    os.makedirs(stale.checkpoints.path(1))  # an upload cut short, never committed
    assert stale.checkpoints.remove_uncommitted() == [1]
    assert not os.path.exists(stale.checkpoints.path(1))
    assert [m.index for m in stale.checkpoints.committed()] == [0]


def test_is_committed_sees_a_marker_written_after_a_negative_lookup(stale):
    os.makedirs(stale.checkpoints.path(5))
    assert not stale.fs.exists(os.path.join(stale.checkpoints.path(5), MARKER))
    _commit_elsewhere(stale, 5)
    assert stale.checkpoints.is_committed("checkpoint_000005")


def test_run_files_written_elsewhere_are_not_taken_as_missing(stale):
    """A restart that took metrics.jsonl for missing would rewrite it empty."""
    for name in ("metrics.jsonl", "run.json", "restores.json"):
        assert not stale.fs.exists(os.path.join(stale.run_path, name))  # cached: not found
    os.makedirs(stale.run_path, exist_ok=True)
    with open(os.path.join(stale.run_path, "metrics.jsonl"), "w") as f:
        f.write('{"training_iteration": 1}\n')
    with open(os.path.join(stale.run_path, "run.json"), "w") as f:
        json.dump({"name": "run", "status": "running"}, f)
    with open(os.path.join(stale.run_path, "restores.json"), "w") as f:
        json.dump([{"time": 1.0, "restored_iteration": 1}], f)
    assert stale.read_metrics() == [{"training_iteration": 1}]
    assert stale.read_run_state().name == "run"
    assert [r.restored_iteration for r in stale.read_restores()] == [1]
