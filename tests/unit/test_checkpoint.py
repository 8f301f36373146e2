"""Checkpoint: a reference to a directory, local or on an fsspec store."""

import os
import shutil
import uuid

import fsspec
import pytest

from elastic_train import Checkpoint, ConfigError, Result
from elastic_train.storage.checkpoint_store import MARKER
from tests.support.file_tree import snapshot


@pytest.fixture
def ckpt_dir(tmp_path):
    d = tmp_path / "ckpt"
    (d / "sub").mkdir(parents=True)
    (d / "model.pt").write_bytes(b"weights")
    (d / "sub" / "opt.pt").write_bytes(b"optimizer")
    (d / MARKER).write_text("{}")
    return d


@pytest.fixture
def memory_ckpt():
    fs = fsspec.filesystem("memory")
    path = f"/ckpt-test-{uuid.uuid4().hex}"
    fs.pipe_file(f"{path}/model.pt", b"weights")
    fs.pipe_file(f"{path}/sub/opt.pt", b"optimizer")
    fs.pipe_file(f"{path}/{MARKER}", b"{}")
    yield Checkpoint(f"memory://{path}")
    fs.rm(path, recursive=True)


EXPECTED = {"model.pt": b"weights", os.path.join("sub", "opt.pt"): b"optimizer"}


def test_from_directory_missing_raises(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ConfigError, match="no such directory") as info:
        Checkpoint.from_directory(missing)
    assert str(missing) in str(info.value)


def test_from_directory_is_absolute_and_local(ckpt_dir, monkeypatch):
    monkeypatch.chdir(ckpt_dir.parent)
    ckpt = Checkpoint.from_directory("ckpt")
    assert ckpt.path == str(ckpt_dir)
    assert ckpt._is_local


def test_to_directory_into_given_path_excludes_marker(ckpt_dir, tmp_path):
    target = tmp_path / "out" / "nested"
    assert Checkpoint.from_directory(ckpt_dir).to_directory(target) == str(target)
    assert snapshot(target) == EXPECTED


def test_to_directory_into_fresh_temp_dir(ckpt_dir):
    ckpt = Checkpoint.from_directory(ckpt_dir)
    first, second = ckpt.to_directory(), ckpt.to_directory()
    try:
        assert first != second
        assert snapshot(first) == EXPECTED
    finally:
        shutil.rmtree(first)
        shutil.rmtree(second)


def test_as_directory_yields_local_path_itself(ckpt_dir):
    with Checkpoint.from_directory(ckpt_dir).as_directory() as d:
        assert d == str(ckpt_dir)
    assert ckpt_dir.exists()


def test_remote_as_directory_downloads_and_cleans_up(memory_ckpt):
    assert not memory_ckpt._is_local
    with memory_ckpt.as_directory() as d:
        assert snapshot(d) == EXPECTED
    assert not os.path.exists(d)


def test_metadata_roundtrip(ckpt_dir):
    ckpt = Checkpoint.from_directory(ckpt_dir)
    assert ckpt.get_metadata() == {}
    ckpt.set_metadata({"epoch": 3, "tags": ["a"]})
    assert ckpt.get_metadata() == {"epoch": 3, "tags": ["a"]}
    ckpt.update_metadata({"epoch": 4, "lr": 0.1})
    assert ckpt.get_metadata() == {"epoch": 4, "tags": ["a"], "lr": 0.1}
    ckpt.set_metadata({"x": 1})
    assert Checkpoint.from_directory(ckpt_dir).get_metadata() == {"x": 1}


def test_metadata_on_memory_store(memory_ckpt):
    memory_ckpt.set_metadata({"a": 1})
    memory_ckpt.update_metadata({"b": 2})
    assert memory_ckpt.get_metadata() == {"a": 1, "b": 2}


def test_non_json_metadata_raises(ckpt_dir):
    ckpt = Checkpoint.from_directory(ckpt_dir)
    with pytest.raises(ConfigError, match="JSON"):
        ckpt.set_metadata({"obj": object()})
    with pytest.raises(ConfigError, match="JSON"):
        ckpt.update_metadata({"s": {1, 2}})
    assert ckpt.get_metadata() == {}


def test_equality_and_hash(ckpt_dir, tmp_path):
    a = Checkpoint.from_directory(ckpt_dir)
    b = Checkpoint(str(ckpt_dir))
    assert a == b and hash(a) == hash(b)
    assert a != Checkpoint.from_directory(tmp_path)
    assert a != str(ckpt_dir)
    assert Checkpoint("memory://x/y") != Checkpoint("/x/y")
    assert "path=" in repr(a)


def test_result_get_best_checkpoint_as_in_ray(tmp_path):
    for name in "abc":
        (tmp_path / name).mkdir()
    a, b, c = (Checkpoint.from_directory(str(tmp_path / n)) for n in "abc")
    result = Result(metrics={}, checkpoint=c, error=None, path=str(tmp_path), filesystem=None,
                    best_checkpoints=[(a, {"loss": 0.5}), (b, {"loss": 0.2}), (c, {})])
    assert result.get_best_checkpoint("loss", "min") == b
    assert result.get_best_checkpoint("loss", "max") == a
    assert result.get_best_checkpoint("acc", "max") is None
    with pytest.raises(ValueError, match="mode='best'"):
        result.get_best_checkpoint("loss", "best")


@pytest.mark.parametrize("metrics, words", [
    ({"loss": object()}, ["'loss'", "object", "JSON"]),
    ({"nested": {"deep": {1, 2}}}, ["'nested.deep'", "set"]),
    ({"t": __import__("torch").ones(3)}, ["'t'", "Tensor"]),
])
def test_metrics_that_are_not_json_are_named(metrics, words):
    from elastic_train._internal.metric_rows import jsonable

    with pytest.raises(ConfigError) as info:
        {k: jsonable(v, k) for k, v in metrics.items()}
    for word in words:
        assert word in str(info.value)


def test_checkpoint_from_missing_directory_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="no such directory"):
        Checkpoint.from_directory(str(tmp_path / "missing"))


def test_commit_info_says_who_wrote_a_checkpoint_and_its_size(tmp_path):
    from elastic_train.storage import CommitManifest
    from elastic_train.storage.filesystem import write_json_atomic

    files = {"__0_0.distcp": {"size": 3 << 20, "crc32": "0", "rank": 0},
             "__1_0.distcp": {"size": 1 << 20, "crc32": "0", "rank": 1},
             ".metadata": {"size": 0, "crc32": "0", "rank": 0}}
    write_json_atomic(fsspec.filesystem("file"), str(tmp_path / MARKER),
                      {"index": 3, "training_iteration": 4, "metrics": {}, "files": files,
                       "world_size": 2})
    checkpoint = Checkpoint(str(tmp_path))
    info = checkpoint.get_commit_info()
    assert (info.ranks, info.size_bytes) == ([0, 1], 4 << 20)
    assert info.describe_contents() == "4.0 MiB from ranks 0, 1"
    assert repr(checkpoint).endswith(", 4.0 MiB from ranks 0, 1)")
    assert Checkpoint(str(tmp_path / "sub")).get_commit_info() is None
    old = CommitManifest(0, 1, {}, {"a": {"size": 10, "crc32": "0"}}, 1)  # before ranks
    assert old.ranks is None and old.describe_contents() == "10 B (ranks not recorded)"
    four = CommitManifest(0, 1, {}, {str(r): {"size": 1, "crc32": "0", "rank": r}
                                     for r in range(4)}, 4)
    assert four.describe_contents() == "4 B from ranks 0-3"


def test_from_directory_written_takes_a_future(ckpt_dir):
    from concurrent.futures import Future

    future = Future()
    assert Checkpoint.from_directory(ckpt_dir, written=future).written is future
    assert Checkpoint.from_directory(ckpt_dir).written is None
    with pytest.raises(ConfigError, match=r"written=.*pass the future of the writes"):
        Checkpoint.from_directory(ckpt_dir, written="soon")
