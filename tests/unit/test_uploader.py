"""The background uploader: who uploads what, staging, checksums, the queue bound, errors,
and close() -- on a local run directory, with threads but no processes."""

import hashlib
import os
import threading
import time
import zlib
from concurrent.futures import Future

import pytest

from elastic_train.errors import StorageError
from elastic_train.storage import CheckpointStore, CommitManifest, RunStorage, background_priority
from elastic_train.storage.uploader import CheckpointUploader, UploadJob
from tests.conftest import committer_for, wait_until
from tests.support.node_settings import use_node_settings


@pytest.fixture
def run(tmp_path):
    return RunStorage.open(str(tmp_path / "results"), "run")


@pytest.fixture
def source(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.pt").write_bytes(b"weights-v1")
    return src


def manifest(index):
    return CommitManifest(index=index, training_iteration=index + 1, metrics={},
                          files={}, world_size=1)


def uploader_for(store, tmp_path, rank=0, **kwargs):
    return CheckpointUploader(store, rank, str(tmp_path / f"staging{rank}"),
                              commit=committer_for(store).commit, **kwargs)


def job(index, relpaths=("model.pt",), owners=(0,), with_manifest=True):
    return UploadJob(index, None if relpaths is None else list(relpaths), list(owners),
                     manifest(index) if with_manifest else None)


class HeldStore(CheckpointStore):
    """Uploads wait until ``release`` is set; ``started`` tells one began."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.started = threading.Event()
        self.release = threading.Event()

    def upload(self, index, local_dir, relpaths, callback=None, cancelled=None):
        self.started.set()
        assert self.release.wait(10)
        super().upload(index, local_dir, relpaths, callback, cancelled)


class FailingStore(CheckpointStore):
    def upload(self, index, local_dir, relpaths, callback=None, cancelled=None):
        raise PermissionError(f"denied: {relpaths}")


def test_files_go_up_from_the_lowest_rank_that_has_them():
    lists = [["a", "b"], ["b", "c"], None]
    plans = [UploadJob.plan(5, lists, rank) for rank in range(3)]
    assert [p.relpaths for p in plans] == [["a", "b"], ["c"], []]
    assert {tuple(p.owner_ranks) for p in plans} == {(0, 1)}
    assert UploadJob.plan(5, [None, ["x"]], 0).owner_ranks == [1]


def test_the_staged_copy_is_uploaded_and_checksummed(run, source, tmp_path):
    """report() may reuse its directory at once: what goes up is what it held then."""
    uploader = uploader_for(run.checkpoints, tmp_path)
    uploader.submit(job(0), str(source))
    (source / "model.pt").write_bytes(b"weights-v2, longer")
    uploader.close()
    [committed] = run.checkpoints.committed()
    assert committed.files == {"model.pt": {
        "size": 10, "rank": 0, "crc32": f"{zlib.crc32(b'weights-v1'):08x}",
        "sha256": hashlib.sha256(b"weights-v1").hexdigest()}}
    assert run.fs.cat_file(f"{run.checkpoints.path(0)}/model.pt") == b"weights-v1"
    assert list((tmp_path / "staging0").iterdir()) == []  # staged copies are removed


def test_a_rank_without_files_commits_the_owners(run, source, tmp_path):
    owner = uploader_for(run.checkpoints, tmp_path, rank=1)
    committer = uploader_for(run.checkpoints, tmp_path, rank=0)
    committer.submit(job(0, relpaths=(), owners=(1,)), None)
    owner.submit(job(0, owners=(1,), with_manifest=False), str(source))
    assert committer.wait_for(0) is None and owner.wait_for(0) is None
    owner.close()
    committer.close()
    assert [m.files.keys() for m in run.checkpoints.committed()] == [{"model.pt"}]


def test_a_full_queue_makes_submit_wait(run, source, tmp_path):
    store = HeldStore(run.fs, run.run_path, run.retry)
    uploader = uploader_for(store, tmp_path, max_pending=1)
    uploader.submit(job(0), str(source))
    assert store.started.wait(10)  # job 0 is uploading, the queue is empty
    uploader.submit(job(1), str(source))  # queued
    third = threading.Thread(target=uploader.submit, args=(job(2), str(source)))
    third.start()
    third.join(0.3)
    assert third.is_alive(), "a third checkpoint was accepted while two were pending"
    store.release.set()
    third.join(10)
    assert not third.is_alive()
    uploader.close()
    assert [m.index for m in run.checkpoints.committed()] == [0, 1, 2]


def test_close_waits_for_every_queued_upload(run, source, tmp_path):
    store = HeldStore(run.fs, run.run_path, run.retry)
    uploader = uploader_for(store, tmp_path)
    uploader.submit(job(0), str(source))
    uploader.submit(job(1), str(source))
    threading.Timer(0.2, store.release.set).start()
    began = time.monotonic()
    uploader.close()
    assert time.monotonic() - began >= 0.2
    assert [m.index for m in run.checkpoints.committed()] == [0, 1]


def test_an_upload_error_reaches_wait_for_the_next_submit_and_close(run, source, tmp_path):
    store = FailingStore(run.fs, run.run_path, run.retry)
    uploader = uploader_for(store, tmp_path)
    uploader.submit(job(0), str(source))
    error = uploader.wait_for(0)
    assert "checkpoint_000000 (rank 0)" in error and "denied" in error
    with pytest.raises(StorageError, match="denied"):
        uploader.raise_if_failed()
    with pytest.raises(StorageError, match="denied"):
        uploader.submit(job(1), str(source))
    with pytest.raises(StorageError, match="checkpoint_000000"):
        uploader.close()
    assert run.checkpoints.committed() == []
    assert list((tmp_path / "staging0").iterdir()) == []


def test_a_commit_error_is_the_jobs_error(run, source, tmp_path):
    def commit(manifest, owners, in_place):
        raise StorageError("marker write failed")

    uploader = CheckpointUploader(run.checkpoints, 0, str(tmp_path / "staging"), commit=commit)
    uploader.submit(job(0), str(source))
    assert "marker write failed" in uploader.wait_for(0)
    with pytest.raises(StorageError, match="marker write failed"):
        uploader.close()


def _being_written(tmp_path, name):
    directory = tmp_path / name
    directory.mkdir()
    (directory / "shard.pt").write_bytes(b"half")
    return directory


def test_files_still_being_written_go_when_the_uploader_is_abandoned(run, source, tmp_path):
    """An in-process restart abandons the uploader while a rank's async save still
    writes: the directory handed over is removed once written, not left behind."""
    store = HeldStore(run.fs, run.run_path, run.retry)
    uploader = uploader_for(store, tmp_path)
    uploader.submit(job(0), str(source))
    assert store.started.wait(10)  # the thread is busy: job 1 stays queued
    written = Future()
    later = _being_written(tmp_path, "async")
    uploader.submit(job(1, relpaths=None), str(later), written)
    threading.Timer(0.2, store.release.set).start()
    uploader.abandon()
    assert later.exists()  # still being written
    written.set_result(None)
    assert not later.exists()


def test_files_whose_write_failed_are_removed(run, source, tmp_path):
    uploader = uploader_for(CheckpointStore(run.fs, run.run_path, run.retry), tmp_path)
    written = Future()
    written.set_exception(OSError("disk full"))
    failed = _being_written(tmp_path, "async")
    uploader.submit(job(0, relpaths=None), str(failed), written)
    assert "disk full" in uploader.wait_for(0)
    assert not failed.exists()


def test_finishing_waits_only_as_long_as_asked_and_abandoning_then_drops_the_rest(
        run, source, tmp_path):
    """An in-process restart finishes the uploads in flight within the agent's bound:
    a job still being written past it is dropped, the thread stops, nothing commits."""
    store = CheckpointStore(run.fs, run.run_path, run.retry)
    uploader = uploader_for(store, tmp_path)
    written = Future()
    uploader.submit(job(0, relpaths=None), str(_being_written(tmp_path, "late")), written)
    started = time.monotonic()
    assert not uploader.finish(0.3)
    assert 0.3 <= time.monotonic() - started < 1.0
    threading.Timer(0.2, written.set_result, (None,)).start()
    uploader.abandon()
    assert not store.is_committed("checkpoint_000000")
    quick = uploader_for(store, tmp_path)
    quick.submit(job(1), str(source))
    assert quick.finish(5.0) and quick.wait_for(1) is None


def test_abandoning_stops_an_upload_in_flight(tmp_path, monkeypatch):
    """An in-process restart must not wait for a large upload to finish: the transfer
    stops at its next part (before: abandon() returned once every file was up)."""
    use_node_settings(monkeypatch, keep_uploads=False)
    run = RunStorage.open(f"memory://{tmp_path.name}/results", "run")
    source = tmp_path / "big"
    source.mkdir()
    names = [f"shard{i}.pt" for i in range(12)]
    for name in names:
        (source / name).write_bytes(b"x" * 4096)
    parts = []

    def slow_put_file(lpath, rpath, callback=None, **kwargs):
        with open(lpath, "rb") as local:
            while chunk := local.read(512):  # 8 parts a file, 0.1 s each: 10 s in all
                time.sleep(0.1)
                parts.append(rpath)
                callback.relative_update(len(chunk))
        run.fs.pipe_file(rpath, b"x" * 4096)

    monkeypatch.setattr(run.fs, "put_file", slow_put_file)
    store = CheckpointStore(run.fs, run.run_path, run.retry)
    uploader = uploader_for(store, tmp_path)
    uploader.submit(job(0, relpaths=names), str(source))
    assert wait_until(lambda: parts, 10)
    started = time.monotonic()
    uploader.abandon()
    assert time.monotonic() - started < 1.0
    assert len(parts) < len(names) * 8  # called off, not finished
    assert uploader.wait_for(0) is None  # no error: nothing to surface after a restart
    assert not store.is_committed("checkpoint_000000")


def test_the_upload_thread_yields_the_cpu_and_the_training_thread_keeps_its_priority(
        run, tmp_path):
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    uploader = uploader_for(run.checkpoints, tmp_path)
    try:
        thread = uploader._thread.native_id
        assert wait_until(lambda: os.getpriority(os.PRIO_PROCESS, thread)
                          == min(19, mine + background_priority.NICENESS), 5)
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine
    finally:
        uploader.close()
