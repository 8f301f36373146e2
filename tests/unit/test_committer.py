"""Rank 0's committer: the score check, the commit after every owner's upload, retention;
and every rank's checkpoint numbering."""

import threading
import time

import pytest
from fsspec.implementations.local import LocalFileSystem

from elastic_train.config import CheckpointConfig
from elastic_train.errors import ConfigError, StorageError
from elastic_train.storage import CheckpointStore, CommitManifest, RunStorage
from elastic_train.storage.checkpoint_store import MARKER, scan_directory
from elastic_train.storage.retention import CheckpointRecord
from elastic_train.storage.retry import RetryPolicy
from elastic_train.worker.committer import Committer
from elastic_train.worker.joined_session import CheckpointNumbers
from tests.conftest import committer_for


@pytest.fixture
def store(tmp_path):
    return CheckpointStore(LocalFileSystem(), str(tmp_path / "run"), RetryPolicy(budget_s=2))


@pytest.fixture
def files(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.pt").write_bytes(b"a" * 10)
    (src / "b.pt").write_bytes(b"b" * 20)
    return str(src)


def upload(store, index, src, rank, relpaths):
    store.upload(index, src, relpaths)
    store.uploads.mark_uploaded(index, rank, {rel: scan_directory(src)[rel] for rel in relpaths})


def manifest(index, **metrics):
    return CommitManifest(index=index, training_iteration=index + 1, metrics=metrics,
                          files={}, world_size=2)


def test_indices_go_on_from_the_first_free_one():
    numbers = CheckpointNumbers(next_index=3)
    assert [numbers.reserve() for _ in range(3)] == [3, 4, 5]
    assert numbers.next_index == 6


def test_a_missing_score_attribute_fails_before_anything_is_uploaded(store):
    config = CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="acc")
    committer = committer_for(store, config)
    with pytest.raises(ConfigError, match="'acc'.*checkpoint 4"):
        committer.check_score({"loss": 1.0}, 4)
    committer.check_score({"acc": 0.5}, 4)
    committer_for(store).check_score({}, 4)  # no attribute: no rule


def test_commit_waits_for_every_owner_and_merges_their_files(store, files):
    committer = committer_for(store)
    upload(store, 0, files, 0, ["a.pt"])
    late = threading.Timer(0.3, upload, (store, 0, files, 1, ["b.pt"]))
    late.start()
    began = time.monotonic()
    committer.commit(manifest(0, loss=1.0), owner_ranks=[0, 1])
    late.join()
    assert time.monotonic() - began >= 0.3
    [committed] = store.committed()
    assert committed.files == scan_directory(files)
    assert store.uploads.uploaded_ranks(0) == set()  # the markers go once committed
    assert committer.committed == [CheckpointRecord(0, {"loss": 1.0})]


def test_an_owner_that_never_uploads_fails_the_commit_by_name(tmp_path, files):
    store = CheckpointStore(LocalFileSystem(), str(tmp_path / "run"), RetryPolicy(budget_s=0.2))
    upload(store, 0, files, 0, ["a.pt"])
    with pytest.raises(StorageError, match=r"ranks \[1\] made no progress uploading "
                                           r"checkpoint_000000 to .* for 0s"):
        committer_for(store).commit(manifest(0), [0, 1])
    assert store.committed() == []


def test_an_owner_whose_upload_advances_is_waited_for_past_the_budget(tmp_path, files):
    """Rank 1 takes 1.2 s, six times the 0.2 s budget, telling its progress as it goes."""
    store = CheckpointStore(LocalFileSystem(), str(tmp_path / "run"), RetryPolicy(budget_s=0.2))
    upload(store, 0, files, 0, ["a.pt"])

    def slow_owner() -> None:
        for sent in range(1, 13):
            time.sleep(0.1)
            store.uploads.note_progress(0, 1, sent * 1000)
        upload(store, 0, files, 1, ["b.pt"])

    owner = threading.Thread(target=slow_owner)
    owner.start()
    began = time.monotonic()
    committer_for(store).commit(manifest(0), [0, 1])
    owner.join()
    assert time.monotonic() - began >= 1.2
    assert [m.index for m in store.committed()] == [0]
    assert store.fs.ls(f"{store.run_path}/.upload-marks", detail=False) == []


def test_an_owner_whose_upload_stalls_fails_the_commit(tmp_path, files):
    store = CheckpointStore(LocalFileSystem(), str(tmp_path / "run"), RetryPolicy(budget_s=0.3))
    upload(store, 0, files, 0, ["a.pt"])
    store.uploads.note_progress(0, 1, 5000)  # some progress, then nothing
    began = time.monotonic()
    with pytest.raises(StorageError, match=r"ranks \[1\] made no progress"):
        committer_for(store).commit(manifest(0), [0, 1])
    assert time.monotonic() - began < 3


def test_retention_after_each_commit_weighs_the_earlier_checkpoints(store, files):
    config = CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="loss",
                              checkpoint_score_order="min")
    for index, loss in ((0, 0.1), (1, 0.5)):
        upload(store, index, files, 0, ["a.pt"])
        store.commit(manifest(index, loss=loss))
    committer = Committer(RunStorage(store.fs, store.run_path, store.retry), config,
                          committed=[CheckpointRecord(0, {"loss": 0.1}),
                                     CheckpointRecord(1, {"loss": 0.5})])
    upload(store, 2, files, 0, ["a.pt"])
    committer.commit(manifest(2, loss=0.9), [0])  # worst, but the latest: kept
    assert [m.index for m in store.committed()] == [0, 2]
    assert [r.index for r in committer.committed] == [0, 2]
    assert not store.fs.exists(f"{store.path(1)}/{MARKER}")


def test_a_failed_deletion_is_retried_at_the_next_commit(store, files, monkeypatch):
    committer = committer_for(store, CheckpointConfig(num_to_keep=1))
    delete = store.delete
    failures = iter([OSError("disk busy")])

    def flaky(index):
        if (error := next(failures, None)) is not None:
            raise error
        delete(index)

    monkeypatch.setattr(store, "delete", flaky)
    for index in range(3):
        upload(store, index, files, 0, ["a.pt"])
        committer.commit(manifest(index), [0])
    assert [m.index for m in store.committed()] == [2]
    assert [r.index for r in committer.committed] == [2]


def test_the_manifest_holds_the_row_and_every_ranks_state_and_rows_are_appended(store):
    committer = committer_for(store)
    row = {"loss": 1.0, "training_iteration": 7}
    made = committer.manifest(3, row, [{"loader:0": {"epoch": 1}}, {}])
    assert (made.index, made.training_iteration, made.metrics, made.files,
            made.world_size) == (3, 7, row, {}, 2)
    assert made.worker_states == {"0": {"loader:0": {"epoch": 1}}, "1": {}}
    store.fs.makedirs(store.run_path, exist_ok=True)
    committer.record_row(row)
    committer.record_row({"loss": 0.5, "training_iteration": 8})
    assert [r["training_iteration"] for r in committer.storage.read_metrics()] == [7, 8]
