"""The node's local tier, the split restore check and the uploader's hand-over, against
fsspec's in-memory store standing in for a remote one (no processes)."""

from __future__ import annotations

import fcntl
import os
import shutil
import threading
from concurrent.futures import Future

import pytest

from elastic_train.errors import StorageError
from elastic_train.storage import CommitManifest
from elastic_train.storage.checkpoint_names import dir_name
from elastic_train.storage.checkpoint_store import list_directory
from elastic_train.storage.restore_check import assigned_files, check_share, choose_intact
from elastic_train.storage.uploader import WRITTEN_LATER, CheckpointUploader, UploadJob
from tests.conftest import committer_for
from tests.support import replicas
from tests.support.node_settings import use_node_settings
from tests.support.replicas import committed, write_files

store, tier = replicas.store, replicas.tier  # the fixtures


SHARDS = {0: {".metadata": b"meta", "__0_0.distcp": b"zero" * 100},
          1: {"__1_0.distcp": b"one" * 100}}


def test_each_file_is_checked_by_its_writer_modulo_the_world_size():
    m = CommitManifest(0, 0, {}, {f"__{r}_0.distcp": {"size": 1, "crc32": "0", "rank": r}
                                  for r in range(4)} | {"old.pt": {"size": 1, "crc32": "0"}},
                       world_size=4)
    assert assigned_files(m, 1, 4) == ["__1_0.distcp"]
    assert assigned_files(m, 0, 2) == ["__0_0.distcp", "__2_0.distcp", "old.pt"]
    assert assigned_files(m, 0, 1) == sorted(m.files)


def test_check_share_downloads_only_this_ranks_files_into_the_tier(store, tier, tmp_path):
    m = committed(store, 0, tmp_path, SHARDS)
    assert check_share(store, m, 1, 2, tier) == []
    entry = tier.entry(store.fs, store.path(0))
    assert list_directory(entry.verified) == ["__1_0.distcp"]
    store.fs.rm(f"{store.path(0)}/__1_0.distcp")  # now served from the node's copy
    assert check_share(store, m, 1, 2, tier) == []


def test_kept_files_are_verified_before_use_and_refetched_when_bad(store, tier, tmp_path):
    m = committed(store, 0, tmp_path, SHARDS)
    staged = tmp_path / "staged"
    write_files(staged, {".metadata": b"meta", "__0_0.distcp": b"rot!" * 100})
    tier.keep(store.fs, store.path(0), str(staged), [".metadata", "__0_0.distcp"])
    store.fs.rm(f"{store.path(0)}/.metadata")  # the kept copy must serve it
    assert check_share(store, m, 0, 2, tier) == []
    entry = tier.entry(store.fs, store.path(0))
    with open(os.path.join(entry.verified, "__0_0.distcp"), "rb") as f:
        assert f.read() == b"zero" * 100  # the rotten kept copy was replaced by a download


def test_damaged_remote_file_is_reported_and_not_kept(store, tier, tmp_path):
    m = committed(store, 0, tmp_path, SHARDS)
    store.fs.pipe_file(f"{store.path(0)}/__1_0.distcp", b"ONE" * 100)
    assert check_share(store, m, 1, 2, tier) == ["__1_0.distcp"]
    assert check_share(store, m, 1, 2, None) == ["__1_0.distcp"]  # streamed, no tier
    assert list_directory(tier.entry(store.fs, store.path(0)).verified) == []


def test_choose_intact_falls_back_together_and_keeps_only_the_chosen(store, tier, tmp_path):
    old = committed(store, 0, tmp_path, SHARDS)
    new = committed(store, 1, tmp_path, SHARDS)
    store.fs.pipe_file(f"{store.path(1)}/__1_0.distcp", b"ONE" * 100)
    votes = []

    def all_ok(mine):  # rank 0 alone here; rank 1 of the group finds checkpoint 1 damaged
        votes.append(mine)
        return mine and len(votes) > 1

    assert choose_intact(store, [old, new], 0, 2, all_ok) == old
    assert votes == [True, True]
    group = os.path.dirname(tier.entry(store.fs, store.path(0)).base)
    assert sorted(os.listdir(group)) == [dir_name(0), dir_name(0) + ".lock"]


def test_local_copy_uses_kept_files_and_downloads_the_rest(store, tier, tmp_path):
    m = committed(store, 0, tmp_path, SHARDS)
    staged = tmp_path / "staged"
    write_files(staged, SHARDS[0])
    tier.keep(store.fs, store.path(0), str(staged), list(SHARDS[0]))
    store.fs.rm(f"{store.path(0)}/__0_0.distcp")  # never downloaded: the node has it
    with tier.local_copy(store.fs, store.path(0), m) as d:
        assert list_directory(d) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    store.fs.pipe_file(f"{store.path(1)}/x", b"x")
    with pytest.raises(StorageError, match="not matching the checkpoint's manifest: x"):
        with tier.local_copy(store.fs, store.path(1), CommitManifest(
                1, 1, {}, {"x": {"size": 1, "crc32": "00000000"}}, 1)):
            pass


def test_local_copy_lets_other_ranks_in_while_one_is_inside(store, tier, tmp_path):
    """A rank inside the block (e.g. in a collective) must not keep out another rank."""
    m = committed(store, 0, tmp_path, SHARDS)
    inside, done = threading.Event(), threading.Event()

    def first():
        with tier.local_copy(store.fs, store.path(0), m):
            inside.set()
            assert done.wait(10)

    thread = threading.Thread(target=first)
    thread.start()
    assert inside.wait(10)
    with tier.local_copy(store.fs, store.path(0), m) as d:
        assert "__1_0.distcp" in list_directory(d)
    done.set()
    thread.join()


def test_prune_spares_entries_being_read(store, tier, tmp_path):
    for index in (3, 4, 5):
        staged = tmp_path / f"s{index}"
        write_files(staged, {"a": b"a"})
        tier.keep(store.fs, store.path(index), str(staged), ["a"])
    held = tier.entry(store.fs, store.path(3))
    with held.locked(fcntl.LOCK_SH):
        tier.supersede(store.fs, store.run_path, lambda index: index == 5)
    group = os.path.dirname(held.base)
    assert sorted(n for n in os.listdir(group) if n.endswith(".kept")) == \
        [dir_name(3) + ".kept", dir_name(5) + ".kept"]


def test_a_reader_that_waited_out_a_removal_is_spared_by_the_next_prune(store, tier, tmp_path):
    """A reader opens the lock file, waits while a prune removes the entry and unlinks
    the file, then fills the entry again under its lock on the unlinked file. The next
    prune, on a new lock file, must still see it reading (before: it took its lock
    unopposed and deleted the files the reader was restoring from)."""
    m = committed(store, 0, tmp_path, SHARDS)
    entry = tier.entry(store.fs, store.path(0))
    with tier.local_copy(store.fs, store.path(0), m):
        pass  # the entry is complete
    reading, done = threading.Event(), threading.Event()
    remover = open(entry.lockfile, "a")  # noqa: SIM115 -- a prune, stopped midway
    fcntl.flock(remover, fcntl.LOCK_EX)

    def reader():
        with tier.local_copy(store.fs, store.path(0), m) as directory:
            reading.set()
            assert done.wait(10)
            assert "__1_0.distcp" in list_directory(directory)

    thread = threading.Thread(target=reader)
    thread.start()
    assert not reading.wait(0.3)  # it has the lock file open, waiting for the prune
    os.remove(entry.complete)  # the rest of that prune: the entry and its lock file go
    shutil.rmtree(entry.verified)
    os.remove(entry.lockfile)
    remover.close()
    assert reading.wait(10)
    tier.prune(store.fs, store.run_path, lambda index: False)
    assert os.path.isdir(entry.verified)
    done.set()
    thread.join(10)


def uploader_for(store, tmp_path) -> CheckpointUploader:
    return CheckpointUploader(store, 0, str(tmp_path / "staging"),
                              commit=committer_for(store).commit)


def test_plan_dedups_listed_files_and_trusts_background_writers():
    lists = [["a", "b"], WRITTEN_LATER, ["b", "c"], None]
    plans = [UploadJob.plan(0, lists, rank) for rank in range(4)]
    assert [p.relpaths for p in plans] == [["a", "b"], None, ["c"], []]
    assert {tuple(p.owner_ranks) for p in plans} == {(0, 1, 2)}


def test_uploader_keeps_uploads_in_the_tier_and_drops_superseded(store, tier, tmp_path):
    uploader = uploader_for(store, tmp_path)
    for index in (0, 1):
        src = tmp_path / f"user{index}"
        write_files(src, {"state.pt": b"s%d" % index})
        manifest = CommitManifest(index, index, {}, {}, 1)
        uploader.submit(UploadJob(index, ["state.pt"], [0], manifest), str(src))
    uploader.close()
    commits = store.committed()
    assert [m.index for m in commits] == [0, 1]
    assert commits[1].files["state.pt"]["rank"] == 0
    group = os.path.dirname(tier.entry(store.fs, store.path(1)).base)
    assert sorted(os.listdir(group)) == [dir_name(1) + ".kept"]  # 0 superseded by 1
    assert os.listdir(tmp_path / "staging") == []


def test_keeping_uploads_can_be_turned_off(store, tier, tmp_path, monkeypatch):
    use_node_settings(monkeypatch, tier_root=tier.root, keep_uploads=False)
    uploader = uploader_for(store, tmp_path)
    write_files(tmp_path / "user", {"state.pt": b"s"})
    uploader.submit(UploadJob(0, ["state.pt"], [0], CommitManifest(0, 0, {}, {}, 1)),
                    str(tmp_path / "user"))
    uploader.close()
    assert store.committed() and not os.path.exists(tier.root)


def test_uploader_takes_over_files_written_in_the_background(store, tmp_path):
    """report() returns while the files are being written; the upload waits for them."""
    written: Future = Future()
    src = tmp_path / "async"
    src.mkdir()
    uploader = uploader_for(store, tmp_path)
    uploader.submit(UploadJob(0, None, [0], CommitManifest(0, 0, {}, {}, 1)), str(src), written)
    write_files(src, {"__0_0.distcp": b"late"})
    assert not store.committed()
    written.set_result(None)
    uploader.close()
    [manifest] = store.committed()
    assert list(manifest.files) == ["__0_0.distcp"] and not src.exists()


def test_a_failed_background_write_fails_the_upload(store, tmp_path):
    written: Future = Future()
    written.set_exception(OSError("disk full"))
    uploader = uploader_for(store, tmp_path)
    uploader.submit(UploadJob(0, None, [0], CommitManifest(0, 0, {}, {}, 1)),
                    str(tmp_path), written)
    with pytest.raises(StorageError, match="disk full"):
        uploader.close()
