"""One adapter per store: the table that picks it, and each store's own behaviour
(S3's on moto's server, through s3fs)."""

import os

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem

from elastic_train.errors import StorageError
from elastic_train.storage import RunStorage
from elastic_train.storage import filesystem as fsutil
from elastic_train.storage.retry import is_transient
from elastic_train.storage.stores import (
    STORES,
    LocalStore,
    S3Store,
    StoreAdapter,
    adapter_for,
    open_url,
)
from elastic_train.storage.stores.s3 import PART_SIZE, PARTS_AT_ONCE
from tests.conftest import make_storage


class BotocoreLikeError(Exception):
    """The shape of botocore's ClientError: the HTTP status in ``response``."""

    def __init__(self, status):
        super().__init__("An error occurred")
        self.response = {"ResponseMetadata": {"HTTPStatusCode": status}}


@pytest.fixture
def s3(tmp_path, s3_endpoint):
    """``(fs, root path)`` in a new bucket of moto's server."""
    storage = make_storage("s3", tmp_path, s3_endpoint)
    fs, path = fsutil.resolve(storage.url, options=storage.options)
    return fs, path


def test_each_protocol_gets_its_stores_adapter():
    assert type(adapter_for(LocalFileSystem())) is LocalStore
    assert type(adapter_for(fsspec.filesystem("s3", skip_instance_cache=True, anon=True))) \
        is S3Store
    assert type(adapter_for(fsspec.filesystem("memory"))) is StoreAdapter
    assert STORES["s3a"] is S3Store and STORES["file"] is LocalStore


def test_a_new_store_is_one_line_in_the_table(monkeypatch):
    """What adding GCS takes: an adapter and its protocol in STORES; callers are unchanged."""
    removed = []

    class Recording(StoreAdapter):
        def remove_tree(self, path):
            removed.append(path)
            super().remove_tree(path)

    monkeypatch.setitem(STORES, "memory", Recording)
    run = RunStorage.open("memory:///stores-test", "run")
    run.checkpoints.fs.pipe_file(f"{run.checkpoints.path(0)}/x", b"1")
    assert run.checkpoints.remove_uncommitted() == [0]
    assert removed == [run.checkpoints.path(0)]


def test_s3_urls_open_with_our_retry_settings_and_plain_paths_as_local(tmp_path):
    fs, path = open_url("s3://bucket/x", {"anon": True, "skip_instance_cache": True})
    assert fs.retries == 1 and path == "bucket/x"
    assert fs.storage_options["config_kwargs"]["retries"] == {"max_attempts": 1}
    fs, path = open_url(str(tmp_path))
    assert adapter_for(fs).is_local and path == str(tmp_path)


def test_the_base_adapter_assumes_only_what_fsspec_promises():
    store = adapter_for(fsspec.filesystem("memory"))
    assert not store.is_local
    assert not store.appends  # its append-only logs go to segments (storage/jsonl_log.py)
    assert store.rename_tree("/m/a", "/m/b") is False
    assert store.link_files(["/a"], ["/m/a"]) is False
    assert store.put_options() == {} and store.missing_bucket("/m") is None
    assert store.abort_unfinished_uploads("/m") == 0
    store.remove_tree("/m/never-there")  # a retry of a removal that went through
    store.write_bytes_atomic("/m/stores-test/f", b"one")
    assert store.fs.cat_file("/m/stores-test/f") == b"one"


def test_local_store_appends_renames_and_writes_by_rename(tmp_path):
    store = adapter_for(LocalFileSystem())
    target = str(tmp_path / "d" / "f")
    store.write_bytes_atomic(target, b"a\n")
    store.append(target, b"b\n")
    assert store.appends and open(target, "rb").read() == b"a\nb\n"
    assert store.rename_tree(str(tmp_path / "d"), str(tmp_path / "e"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e"]


def test_transient_errors_are_the_stores_own():
    s3 = adapter_for(fsspec.filesystem("s3", skip_instance_cache=True, anon=True))
    memory = adapter_for(fsspec.filesystem("memory"))
    assert [s3.transient(BotocoreLikeError(c)) for c in (500, 503, 429, 404, 403)] == \
        [True, True, True, False, False]
    assert not memory.transient(BotocoreLikeError(503))
    wrapped = OSError("wrapped")  # s3fs raises its own errors from botocore's
    wrapped.__cause__ = BotocoreLikeError(503)
    assert is_transient(wrapped, RunStorage(s3.fs, "b/run").retry.store_sign)
    assert not is_transient(wrapped, RunStorage(memory.fs, "/run").retry.store_sign)


def test_s3_bounds_a_files_multipart_memory():
    s3 = adapter_for(fsspec.filesystem("s3", skip_instance_cache=True, anon=True))
    assert s3.put_options() == {"chunksize": PART_SIZE, "max_concurrency": PARTS_AT_ONCE}


def test_s3_names_a_missing_bucket_and_only_that(s3):
    fs, path = s3
    store = adapter_for(fs)
    assert store.missing_bucket(path) is None
    assert store.missing_bucket("no-such-bucket-here/results") == "no-such-bucket-here"


def test_s3_remove_tree_also_deletes_the_directory_key(s3, monkeypatch):
    """SeaweedFS lists an emptied directory until its ``dir/`` key goes (moto does not:
    the call is checked here, SeaweedFS's listing in tests/e2e/test_seaweedfs.py)."""
    fs, path = s3
    bucket, key, _ = fs.split_path(f"{path}/checkpoint_000001")
    fs.pipe_file(f"{path}/checkpoint_000001/state.pt", b"x")
    fs.call_s3("put_object", Bucket=bucket, Key=key + "/", Body=b"")
    calls = []
    call_s3 = fs.call_s3

    def recording(method, **kwargs):
        calls.append((method, kwargs.get("Key")))
        return call_s3(method, **kwargs)

    monkeypatch.setattr(fs, "call_s3", recording)
    adapter_for(fs).remove_tree(f"{path}/checkpoint_000001")
    assert ("delete_object", key + "/") in calls
    monkeypatch.undo()
    assert fs.call_s3("list_objects_v2", Bucket=bucket, Prefix=key).get("KeyCount", 0) == 0
    adapter_for(fs).remove_tree(f"{path}/checkpoint_000001")  # gone already: fine


def test_s3_aborts_the_multipart_uploads_a_killed_writer_left(s3):
    fs, path = s3
    bucket, root, _ = fs.split_path(path)
    for name in ("a.pt", "b.pt"):
        fs.call_s3("create_multipart_upload", Bucket=bucket, Key=f"{root}/ckpt/{name}")
    store = adapter_for(fs)
    assert store.abort_unfinished_uploads(path, only=[f"{path}/ckpt/a.pt"]) == 1
    left = fs.call_s3("list_multipart_uploads", Bucket=bucket).get("Uploads", [])
    assert [u["Key"] for u in left] == [f"{root}/ckpt/b.pt"]
    assert store.abort_unfinished_uploads(path) == 1
    assert fs.call_s3("list_multipart_uploads", Bucket=bucket).get("Uploads", []) == []


@pytest.mark.timeout(20)
def test_a_fifo_is_refused_before_a_byte_is_read(tmp_path):
    """A read of a FIFO no one writes never ends (its open waits for a writer): the local
    store names it instead, at once."""
    fifo = tmp_path / "metrics.jsonl"
    os.mkfifo(fifo)
    fs = LocalFileSystem()
    with pytest.raises(StorageError, match="metrics.jsonl is not a regular file but a FIFO"):
        fsutil.read_bytes(fs, str(fifo))
    with pytest.raises(IsADirectoryError):
        fsutil.read_bytes(fs, str(tmp_path))


@pytest.mark.timeout(20)
@pytest.mark.parametrize("entry, read", [
    ("run.json", RunStorage.read_run_state), ("metrics.jsonl", RunStorage.read_metrics),
    ("restores.json", RunStorage.read_restores), ("trainable.pkl", RunStorage.read_trainable),
    ("goodput/rank0.jsonl", RunStorage.read_ledger)], ids=lambda v: getattr(v, "__name__", v))
def test_every_reader_of_a_run_refuses_a_fifo(tmp_path, entry, read):
    (tmp_path / entry).parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(tmp_path / entry)
    with pytest.raises(StorageError, match=f"{entry} is not a regular file but a FIFO"):
        read(RunStorage(LocalFileSystem(), str(tmp_path)))


@pytest.mark.parametrize("fs", [LocalFileSystem(), fsspec.filesystem("memory")],
                         ids=["local", "memory"])
def test_whole_file_reads_are_bounded(tmp_path, monkeypatch, fs):
    path = str(tmp_path / "run.json")
    fs.pipe_file(path, b"x" * 100)
    monkeypatch.setattr(fsutil, "READ_LIMIT", 100)
    assert fsutil.read_bytes(fs, path) == b"x" * 100
    monkeypatch.setattr(fsutil, "READ_LIMIT", 99)
    with pytest.raises(StorageError, match="run.json is larger than 99 bytes"):
        fsutil.read_bytes(fs, path)
