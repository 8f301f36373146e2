"""Run storage and checkpoint commits, the same tests on local disk, on S3 (moto's server,
through s3fs) and on fsspec's in-memory store (the adapter every other store gets)."""

import errno
import hashlib
import json
import os
import uuid
import zlib

import cloudpickle
import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem

from elastic_train import ConfigError
from elastic_train.checkpoint import Checkpoint
from elastic_train.errors import StorageError, WorkerFailure
from elastic_train.storage import CheckpointStore, CommitManifest, RunStorage
from elastic_train.storage import filesystem as fsutil
from elastic_train.storage.checkpoint_names import MAX_NAME_BYTES, check_dir_name, dir_name
from elastic_train.storage.checkpoint_store import (
    DAMAGED_DIR,
    MARKER,
    list_directory,
    mismatched_files,
    scan_directory,
)
from elastic_train.storage.jsonl_log import SEGMENT_BYTES, SEGMENTS_SUFFIX, segment_path
from elastic_train.storage.run_state import (
    IN_PROCESS,
    FailureKind,
    FailureRecord,
    LaunchRecord,
    RunState,
    RunStatus,
)
from elastic_train.storage.run_storage import METRICS_FILE, RUN_FILE, RUN_FORMAT_VERSION
from elastic_train.storage.stores import S3Store
from tests.conftest import make_storage


@pytest.fixture(params=["local", "s3", "memory"])
def root(request, tmp_path):
    """``(storage_path URL, fs, path, options)`` of an empty storage root."""
    if request.param == "local":
        yield str(tmp_path / "store"), LocalFileSystem(), str(tmp_path / "store"), None
        return
    if request.param == "s3":
        storage = make_storage("s3", tmp_path, request.getfixturevalue("s3_endpoint"))
        fs, path = fsutil.resolve(storage.url, options=storage.options)
        yield storage.url, fs, path, storage.options
        return
    fs = fsspec.filesystem("memory")
    path = f"/elastic-train-test-{uuid.uuid4().hex}"
    yield f"memory://{path}", fs, path, None
    if fs.exists(path):
        fs.rm(path, recursive=True)


@pytest.fixture
def run(root):
    url, _, _, options = root
    return RunStorage.open(url, "run", options=options)


@pytest.fixture
def local_ckpt(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "model.pt").write_bytes(b"weights" * 100)
    (src / "sub" / "opt.pt").write_bytes(b"optimizer")
    return str(src)


def manifest(index, files, **metrics):
    return CommitManifest(index=index, training_iteration=index + 1, metrics=metrics,
                          files=files, world_size=2, worker_states={"0": {"epoch": 1}})


def commit(store, index, src):
    files = scan_directory(src)
    store.upload(index, src, files)
    m = manifest(index, files, loss=0.5)
    store.commit(m)
    return m


def test_open_resolves_store(run, root):
    _, fs, path, _ = root
    assert type(run.fs) is type(fs)
    assert run.run_path == f"{path}/run"
    assert run.is_local == (type(fs) is LocalFileSystem)


def test_upload_then_commit_makes_checkpoint_visible(run, local_ckpt):
    store = run.checkpoints
    run.ensure_writable()
    files = scan_directory(local_ckpt)
    store.upload(3, local_ckpt, files)
    assert store.committed() == []
    m = manifest(3, files, loss=0.25)
    store.commit(m)
    [seen] = store.committed()
    assert (seen.index, seen.metrics, seen.files, seen.worker_states) == \
        (3, {"loss": 0.25}, files, {"0": {"epoch": 1}})
    assert mismatched_files(Checkpoint(store.path(3), run.fs).to_directory(), seen) == []
    assert run.fs.cat_file(f"{store.path(3)}/sub/opt.pt") == b"optimizer"


def test_committed_is_oldest_first(run, local_ckpt):
    store = CheckpointStore(run.fs, run.run_path)  # a second handle on the same run
    for index in (2, 0, 1):
        commit(store, index, local_ckpt)
    assert [m.index for m in run.checkpoints.committed()] == [0, 1, 2]


def test_committed_on_missing_run_dir_is_empty(run):
    assert run.checkpoints.committed() == []
    assert run.checkpoints.remove_uncommitted() == []


def test_uncommitted_dir_is_invisible_and_removed(run, local_ckpt):
    store = run.checkpoints
    commit(store, 0, local_ckpt)
    store.upload(1, local_ckpt, scan_directory(local_ckpt))
    assert [m.index for m in store.committed()] == [0]
    assert store.remove_uncommitted() == [1]
    assert not run.fs.exists(store.path(1))
    assert run.fs.exists(store.path(0))
    assert [m.index for m in store.committed()] == [0]


def test_delete_removes_marker_and_dir(run, local_ckpt):
    store = run.checkpoints
    commit(store, 0, local_ckpt)
    commit(store, 1, local_ckpt)
    store.delete(0)
    assert not run.fs.exists(f"{store.path(0)}/{MARKER}")
    assert not run.fs.exists(store.path(0))
    assert [m.index for m in store.committed()] == [1]


def test_mismatched_files_reports_truncated_corrupted_and_deleted(run, local_ckpt, tmp_path):
    store = run.checkpoints
    m = commit(store, 0, local_ckpt)
    base = store.path(0)

    def bad():
        return sorted(mismatched_files(Checkpoint(base, run.fs).to_directory(
            str(tmp_path / f"copy{len(os.listdir(tmp_path))}")), m))

    run.fs.pipe_file(f"{base}/model.pt", b"weights")  # truncated
    assert bad() == ["model.pt"]
    size = m.files["model.pt"]["size"]
    run.fs.pipe_file(f"{base}/model.pt", b"x" * size)  # same size, other bytes
    assert bad() == ["model.pt"]
    run.fs.rm(f"{base}/sub/opt.pt")
    assert bad() == ["model.pt", "sub/opt.pt"]


def test_scan_directory_sizes_crc_and_no_marker(local_ckpt):
    with open(os.path.join(local_ckpt, MARKER), "w") as f:
        f.write("{}")
    files = scan_directory(local_ckpt)
    assert set(files) == {"model.pt", "sub/opt.pt"}
    data = b"weights" * 100
    assert files["model.pt"] == {"size": len(data), "crc32": f"{zlib.crc32(data):08x}",
                                 "sha256": hashlib.sha256(data).hexdigest()}
    assert files["sub/opt.pt"]["size"] == len(b"optimizer")


def test_dir_name_and_manifest_from_json_ignores_unknown_keys():
    assert dir_name(7) == "checkpoint_000007"
    data = {"index": 1, "training_iteration": 2, "metrics": {}, "files": {}, "world_size": 1,
            "future_field": True}
    assert CommitManifest.from_json(data).index == 1


def test_run_state_roundtrip_adds_format_version(run):
    assert run.read_run_state() is None
    state = RunState(name="run", created=1.0, status=RunStatus.RUNNING,
                     launches=[LaunchRecord(started=1.0, pid=7, host="h")])
    run.write_run_state(state)
    assert run.read_run_state() == state
    assert fsutil.read_json(run.fs, f"{run.run_path}/run.json")["format_version"] == \
        RUN_FORMAT_VERSION


def test_run_state_keeps_how_failures_restarted_and_why_the_run_stopped(run):
    failure = WorkerFailure(rank=1, local_rank=1, pid=3, exitcode=-9, message="", traceback=None)
    state = RunState(name="run", status=RunStatus.FAILED, no_progress="no progress in 3 ...",
                     failures=[FailureRecord(time=2.0, failed_at=1.0, restarts_left=-1,
                                             kind=FailureKind.FAILURE, workers=[failure],
                                             rendezvous_at=2.5, restart=IN_PROCESS,
                                             replaced={1: "its process ended"})])
    run.write_run_state(state)
    assert run.read_run_state() == state
    older = RunState.from_json({"failures": [{"time": 1.0, "workers": []}]})
    assert older.failures[0].restart is None and older.no_progress is None


def test_newer_run_format_asks_to_upgrade(run):
    fsutil.write_json_atomic(run.fs, f"{run.run_path}/{RUN_FILE}",
                             {"status": "running", "format_version": RUN_FORMAT_VERSION + 1})
    with pytest.raises(StorageError, match="upgrade"):
        run.read_run_state()


def test_corrupt_run_state_raises_storage_error(run):
    run.fs.makedirs(run.run_path, exist_ok=True)
    run.fs.pipe_file(f"{run.run_path}/{RUN_FILE}", b'{"status": ')
    with pytest.raises(StorageError, match=RUN_FILE):
        run.read_run_state()


def test_read_metrics_stops_at_truncated_line(run):
    assert run.read_metrics() == []
    run.fs.makedirs(run.run_path, exist_ok=True)
    run.fs.pipe_file(f"{run.run_path}/{METRICS_FILE}", b'{"a": 1}\n{"a": 2}\n{"a": ')
    assert run.read_metrics() == [{"a": 1}, {"a": 2}]


def test_append_metrics(run):
    run.ensure_writable()
    history = []
    for i in range(3):
        row = {"training_iteration": i + 1}
        history.append(row)
        run.append_metrics(row, list(history))
    assert run.read_metrics() == history
    run.write_metrics(history[:1])
    assert run.read_metrics() == history[:1]


def _row(i):
    return {"training_iteration": i, "loss": 1.0 / i, "pad": "x" * 2000}


@pytest.fixture
def bytes_written(monkeypatch):
    """The bytes of each write of the run directory (a whole file, or an append) in turn."""
    from elastic_train.storage.stores import LocalStore

    writes = []
    put, append = fsutil.write_bytes_atomic, LocalStore.append
    monkeypatch.setattr(fsutil, "write_bytes_atomic",
                        lambda fs, path, data: (writes.append(len(data)), put(fs, path, data)))
    monkeypatch.setattr(LocalStore, "append", lambda self, path, data: (
        writes.append(len(data)), append(self, path, data)))
    return writes


def test_a_metrics_row_costs_the_same_however_many_came_before(run, bytes_written):
    """No store uploads the whole history at each report: what one append writes is
    bounded (one segment where the store cannot append), whatever the row's number."""
    run.ensure_writable()
    history = []
    for i in range(1, 201):
        history.append(_row(i))
        bytes_written.clear()
        run.append_metrics(history[-1], history)
        assert sum(bytes_written) <= SEGMENT_BYTES + 2100, (i, bytes_written)
    assert run.read_metrics() == history


def test_a_rewrite_of_the_metrics_keeps_one_layout_that_reads_back(run):
    """A resume's shorter history, then appends: the rows read are exactly those, on
    every store (segments past the new end are gone)."""
    run.ensure_writable()
    rows = [_row(i) for i in range(1, 101)]
    run.write_metrics(rows)
    run.write_metrics(rows[:7])
    assert run.read_metrics() == rows[:7]
    again = RunStorage(run.fs, run.run_path)  # a new process: its first append knows nothing
    again.append_metrics(rows[7], rows[:8])
    again.append_metrics(rows[8], rows[:9])
    assert run.read_metrics() == rows[:9]
    again.write_metrics([])
    assert run.read_metrics() == []


def test_metrics_of_a_run_directory_written_before_segments_still_read(run):
    """An old run directory has one metrics.jsonl on every store: read as it is; the
    first rewrite (a resume) takes it into the store's own layout and leaves one."""
    rows = [_row(i) for i in range(1, 40)]
    run.fs.makedirs(run.run_path, exist_ok=True)
    run.fs.pipe_file(f"{run.run_path}/{METRICS_FILE}",
                     "".join(json.dumps(r) + "\n" for r in rows).encode())
    assert run.read_metrics() == rows
    run.write_metrics(rows[:30])
    run.append_metrics(rows[30], rows[:31])
    assert RunStorage(run.fs, run.run_path).read_metrics() == rows[:31]
    names = fsutil.names_in(run.fs, run.run_path)
    assert (METRICS_FILE in names) != (METRICS_FILE + SEGMENTS_SUFFIX in names), names


def test_a_metrics_segment_that_is_no_regular_file_is_refused_before_it_is_read(tmp_path):
    """A FIFO where a segment should be (a run directory copied or crafted) would be read
    for ever: a StorageError naming it instead."""
    run = RunStorage.open(str(tmp_path), "run")
    segments = tmp_path / "run" / (METRICS_FILE + SEGMENTS_SUFFIX)
    segments.mkdir(parents=True)
    os.mkfifo(segments / "000000.jsonl")
    with pytest.raises(StorageError, match="000000.jsonl is not a regular file"):
        run.read_metrics()


def test_metrics_segments_read_up_to_the_first_missing_one(run):
    """A segment missing (lost, removed by hand) ends the rows: none past it is read."""
    if run.adapter.appends:
        pytest.skip("a store that appends keeps one file")
    rows = [_row(i) for i in range(1, 200)]
    run.ensure_writable()
    run.write_metrics(rows)
    run.fs.rm(segment_path(run._path(METRICS_FILE), 1))
    kept = run.read_metrics()
    assert kept == rows[:len(kept)] and 0 < len(kept) < 40


def test_a_reader_that_polls_fetches_only_the_segments_that_changed(run, monkeypatch):
    """The driver reads the rows at every poll: a new row costs it the last segment, not
    the whole history; a rewrite (a validation's metrics) reads back whole."""
    if run.adapter.appends:
        pytest.skip("a store that appends keeps one file")
    run.ensure_writable()
    rows = [_row(i) for i in range(1, 101)]
    run.write_metrics(rows)
    reader = RunStorage(run.fs, run.run_path)
    assert reader.read_metrics() == rows
    fetched, cat = [], run.fs.cat
    monkeypatch.setattr(run.fs, "cat", lambda paths, **kw: (fetched.append(len(paths)),
                                                           cat(paths, **kw))[1])
    rows.append(_row(101))
    run.append_metrics(rows[-1], rows)
    assert reader.read_metrics() == rows and fetched == [1]
    rows[0]["loss"] = 0.5
    run.write_metrics(rows)
    assert reader.read_metrics() == rows


def skip_on_s3(fs, why):
    if "s3" in fs.protocol:
        pytest.skip(f"S3 has no directories: {why}")


def test_ensure_writable_creates_dir_and_leaves_no_probe(run):
    skip_on_s3(run.fs, "a prefix exists once a key under it does")
    run.ensure_writable()
    run.fs.invalidate_cache(run.run_path)
    assert run.fs.isdir(run.run_path)
    assert run.fs.ls(run.run_path, detail=False) == []


def test_ensure_writable_rejects_existing_file(run):
    run.fs.makedirs(run.run_path.rsplit("/", 1)[0], exist_ok=True)
    run.fs.pipe_file(run.run_path, b"not a directory")
    with pytest.raises(ConfigError, match="existing file") as info:
        run.ensure_writable()
    assert run.display_path in str(info.value)


def test_ensure_writable_rejects_path_under_a_file(root):
    url, fs, path, options = root
    skip_on_s3(fs, "a key and keys under its name as a prefix can coexist")
    fs.makedirs(path, exist_ok=True)
    fs.pipe_file(f"{path}/plain", b"x")
    storage = RunStorage.open(f"{url}/plain", "run", options=options)
    with pytest.raises(ConfigError, match="Cannot write"):
        storage.ensure_writable()


def test_ensure_writable_rejects_read_only_parent(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root ignores directory permissions")
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        with pytest.raises(ConfigError, match="Cannot write"):
            RunStorage.open(str(parent), "run").ensure_writable()
    finally:
        parent.chmod(0o700)


def test_write_bytes_atomic_leaves_no_temp_file(root):
    _, fs, path, _ = root
    target = f"{path}/dir/file.json"
    fsutil.write_bytes_atomic(fs, target, b"one")
    fsutil.write_bytes_atomic(fs, target, b"two")
    assert fs.cat_file(target) == b"two"
    fs.invalidate_cache(f"{path}/dir")
    assert fs.ls(f"{path}/dir", detail=False) == [target]


def test_write_json_atomic_roundtrip(root):
    _, fs, path, _ = root
    fsutil.write_json_atomic(fs, f"{path}/x.json", {"b": 1, "a": [1, 2]})
    assert fsutil.read_json(fs, f"{path}/x.json") == {"a": [1, 2], "b": 1}
    assert json.loads(fs.cat_file(f"{path}/x.json")) == {"a": [1, 2], "b": 1}


def test_resolve_expands_home_and_relative(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    fs, path = fsutil.resolve("~/results")
    assert fsutil.is_local(fs)
    assert path == str(tmp_path / "results")
    monkeypatch.chdir(tmp_path)
    _, path = fsutil.resolve("rel/dir")
    assert os.path.isabs(path) and path == str(tmp_path / "rel" / "dir")


def test_resolve_url_and_explicit_filesystem():
    fs, path = fsutil.resolve("memory://bucket/x")
    assert not fsutil.is_local(fs) and path == "/bucket/x"
    assert fsutil.display_path(fs, path) == "memory:///bucket/x"
    mem = fsspec.filesystem("memory")
    assert fsutil.resolve("memory://a/b", mem) == (mem, "/a/b")


def test_join():
    assert fsutil.join("/a/", "b", "", "c") == "/a/b/c"


def test_append_after_repair_of_truncated_line_is_readable(run):
    """A crash can cut the last line short; each session start rewrites the history first."""
    run.fs.makedirs(run.run_path, exist_ok=True)
    run.fs.pipe_file(f"{run.run_path}/{METRICS_FILE}", b'{"training_iteration": 1}\n{"tra')
    history = run.read_metrics()
    run.write_metrics(history)
    row = {"training_iteration": 2}
    run.append_metrics(row, history + [row])
    assert run.read_metrics() == history + [row]


def test_s3_gets_one_attempt_per_call_unless_the_user_says_otherwise():
    """Every retry is ours (backoff within storage_retry_timeout_s), not s3fs's or
    botocore's underneath it; the user's own settings win."""
    assert S3Store.filesystem_options(None) == {
        "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 10,
                          "read_timeout": 60}}
    mine = S3Store.filesystem_options({"endpoint_url": "http://x",
                                       "config_kwargs": {"connect_timeout": 2}})
    assert mine["endpoint_url"] == "http://x"
    assert mine["config_kwargs"]["connect_timeout"] == 2
    assert mine["config_kwargs"]["retries"] == {"max_attempts": 1}


def test_upload_marks_being_written_are_not_counted(run):
    """A rank's marker is written to a temporary name, then renamed: a listing in
    between (another rank checking for commit) must not choke on it."""
    store = run.checkpoints
    store.uploads.mark_uploaded(0, 0, {})
    tmp = store.uploads._mark(0, 1) + ".tmp-5e672569"
    store.fs.pipe_file(tmp, b"")
    assert store.uploads.uploaded_ranks(0) == {0}


def test_upload_marks_carry_the_checksums_the_commit_records(run, local_ckpt):
    """Each owner's marker holds its files' sizes and CRC-32s; the committing rank merges
    them, so report() itself never reads the files."""
    store = run.checkpoints
    described = scan_directory(local_ckpt)
    mine = {rel: info for rel, info in described.items() if rel.startswith("sub/")}
    theirs = {rel: info for rel, info in described.items() if not rel.startswith("sub/")}
    store.uploads.mark_uploaded(2, 0, mine)
    store.uploads.mark_uploaded(2, 1, theirs)
    assert store.uploads.uploaded_files(2, [0, 1]) == described
    assert described["sub/opt.pt"] == {"size": 9, "crc32": f"{zlib.crc32(b'optimizer'):08x}",
                                       "sha256": hashlib.sha256(b"optimizer").hexdigest()}


def test_local_upload_links_instead_of_copying(tmp_path, local_ckpt, monkeypatch):
    """On the same device the staged files are hard-linked into the run directory;
    where linking fails (another device) they are copied, with no link left behind."""
    store = RunStorage.open(str(tmp_path / "runs"), "run").checkpoints
    store.upload(0, local_ckpt, list_directory(local_ckpt))
    source = os.stat(os.path.join(local_ckpt, "sub", "opt.pt"))
    linked = os.stat(os.path.join(store.path(0), "sub", "opt.pt"))
    assert (linked.st_dev, linked.st_ino) == (source.st_dev, source.st_ino)

    def cross_device(src, dst):
        if dst.endswith("opt.pt"):
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        os.close(os.open(dst, os.O_CREAT | os.O_WRONLY))  # what a partial attempt leaves

    monkeypatch.setattr(os, "link", cross_device)
    store.upload(1, local_ckpt, list_directory(local_ckpt))
    copied = os.stat(os.path.join(store.path(1), "sub", "opt.pt"))
    assert copied.st_ino != source.st_ino
    assert scan_directory(store.path(1)) == scan_directory(local_ckpt)


def test_credentials_are_left_out_of_what_is_stored():
    """Secrets go, also nested; where the store is stays; a filesystem rebuilt without
    them pickles without them, and a checkpoint on it is rebound to the run's."""
    options = {"endpoint_url": "http://127.0.0.1:9", "key": "AKIA-ID", "secret": "s3cr3t",
               "token": "t0k3n", "client_kwargs": {"region_name": "x",
                                                   "aws_secret_access_key": "s3cr3t"}}
    assert fsutil.public_options(options) == {"endpoint_url": "http://127.0.0.1:9",
                                              "client_kwargs": {"region_name": "x"}}
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **options)
    checkpoint = Checkpoint("bucket/run/checkpoint_000001", fs)
    stored = cloudpickle.dumps(checkpoint.without_credentials())
    assert b"s3cr3t" not in stored and b"t0k3n" not in stored and b"AKIA-ID" not in stored
    loaded = cloudpickle.loads(stored)
    assert loaded.path == checkpoint.path and loaded.rebound(fs).filesystem is fs
    elsewhere = fsspec.filesystem("s3", skip_instance_cache=True, endpoint_url="http://other")
    assert loaded.rebound(elsewhere) is loaded
    local = Checkpoint("/tmp/x")
    assert local.without_credentials().filesystem is local.filesystem


def test_two_ranks_uploading_one_file_is_refused(run):
    store = run.checkpoints
    for rank in (0, 1):
        store.uploads.mark_uploaded(5, rank, {"state.pt": {"size": 1, "crc32": "0", "rank": rank}})
    with pytest.raises(StorageError, match="ranks 0 and 1 both wrote state.pt"):
        store.uploads.uploaded_files(5, [0, 1])


def test_sweep_removes_uncommitted_and_returns_the_committed(run, local_ckpt):
    store = run.checkpoints
    commit(store, 0, local_ckpt)
    store.upload(1, local_ckpt, scan_directory(local_ckpt))
    commit(store, 2, local_ckpt)
    removed, manifests = store.sweep()
    assert removed == [1] and [m.index for m in manifests] == [0, 2]
    assert [m.index for m in store.committed()] == [0, 2]


def commit_named(store, index, name, src):
    """A checkpoint committed into the directory ``name`` (report(checkpoint_dir_name=))."""
    store.names.claim(index, name)
    files = scan_directory(src)
    store.upload(index, src, files)
    m = manifest(index, files, loss=0.5)
    m.checkpoint_dir_name = name
    store.commit(m)
    return m


def test_a_claimed_name_is_the_checkpoints_directory_for_every_reader(run, local_ckpt):
    commit(run.checkpoints, 0, local_ckpt)
    commit_named(run.checkpoints, 1, "epoch_1", local_ckpt)
    store = CheckpointStore(run.fs, run.run_path)  # a second handle, as another process's
    assert [(m.index, m.name) for m in store.committed()] == [(0, "checkpoint_000000"),
                                                              (1, "epoch_1")]
    assert store.path(1) == fsutil.join(run.run_path, "epoch_1")
    assert run.fs.exists(fsutil.join(run.run_path, "epoch_1", "sub", "opt.pt"))
    store.delete(1)  # retention: the directory, then its claim
    assert not run.fs.exists(store.path(1))
    assert [m.index for m in CheckpointStore(run.fs, run.run_path).committed()] == [0]
    assert CheckpointStore(run.fs, run.run_path).sweep() == ([], store.committed())


def test_a_name_the_run_has_already_is_refused_before_any_upload(run, local_ckpt):
    store = run.checkpoints
    commit_named(store, 0, "best", local_ckpt)
    with pytest.raises(ConfigError, match=r"checkpoint_dir_name='best'.*unique within the run"):
        store.names.claim(1, "best")
    fsutil.write_json_atomic(run.fs, fsutil.join(run.run_path, "notes", "mine.json"), {})
    with pytest.raises(ConfigError, match=r"'notes'.*already has a checkpoint or an entry"):
        store.names.claim(2, "notes")
    assert [m.index for m in store.committed()] == [0]


def test_the_longest_name_report_accepts_is_claimed_and_committed(run, local_ckpt):
    """check_dir_name's byte limit leaves room for the claim's index and the temporary
    name of its atomic write: no ENAMETOOLONG from the claim of a name it accepts."""
    name = check_dir_name("é" * (MAX_NAME_BYTES // 2) + "x" * (MAX_NAME_BYTES % 2))
    assert len(name.encode()) == MAX_NAME_BYTES
    commit_named(run.checkpoints, 10**12 - 1, name, local_ckpt)
    assert [m.name for m in CheckpointStore(run.fs, run.run_path).committed()] == [name]


def test_a_damaged_checkpoint_set_aside_frees_its_name_and_keeps_its_number(run, local_ckpt):
    store = run.checkpoints
    commit_named(store, 0, "epoch_0", local_ckpt)
    damaged = commit_named(store, 1, "epoch_1", local_ckpt)
    store.set_aside(1)
    aside = fsutil.join(run.run_path, DAMAGED_DIR, "000001.epoch_1")
    assert json.loads(run.fs.cat_file(fsutil.join(aside, MARKER)))["index"] == 1
    assert run.fs.cat_file(fsutil.join(aside, "sub", "opt.pt")) == b"optimizer"
    assert not run.fs.exists(fsutil.join(run.run_path, "epoch_1"))
    again = CheckpointStore(run.fs, run.run_path)  # the next start's
    assert [m.name for m in again.committed()] == ["epoch_0"]
    assert again.sweep()[0] == [1]  # its number stays used
    commit_named(again, 2, "epoch_1", local_ckpt)  # the name is free again
    assert [(m.index, m.name) for m in again.committed()] == [(0, "epoch_0"), (2, "epoch_1")]
    assert damaged.files == again.committed()[1].files


def test_sweep_removes_claimed_uploads_cut_short_and_leaves_other_entries(run, local_ckpt):
    store = run.checkpoints
    commit_named(store, 0, "kept", local_ckpt)
    store.names.claim(1, "cut_short")
    store.upload(1, local_ckpt, scan_directory(local_ckpt))
    store.names.claim(2, "never_started")
    fsutil.write_json_atomic(run.fs, fsutil.join(run.run_path, "notes", "mine.json"), {})
    removed, manifests = CheckpointStore(run.fs, run.run_path).sweep()
    assert removed == [1, 2] and [m.name for m in manifests] == ["kept"]
    assert not run.fs.exists(fsutil.join(run.run_path, "cut_short"))
    assert run.fs.exists(fsutil.join(run.run_path, "notes", "mine.json"))
    store.names.claim(3, "cut_short")  # the name is free again


def test_sweep_leaves_the_files_of_a_no_upload_commit_cut_short(run, local_ckpt):
    store = run.checkpoints
    fsutil.write_json_atomic(run.fs, fsutil.join(run.run_path, "by_hand", "state.json"), {})
    store.names.claim(0, "by_hand", in_place=True)
    assert store.describe_in_place(0)["state.json"]["size"] == 2
    removed, manifests = CheckpointStore(run.fs, run.run_path).sweep()
    assert (removed, manifests) == ([0], [])
    assert run.fs.exists(fsutil.join(run.run_path, "by_hand", "state.json"))
