"""One rank's report() in-process (a world of one, no process group): join() returns the
joined session, rank 0's committer records the row and commits, and the after-report
hooks run once the report is done, in order."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading

import pytest
import torch

import elastic_train as et
from elastic_train.context import WorkerEnv
from elastic_train.storage import RunStorage
from elastic_train.storage.checkpoint_store import scan_directory
from elastic_train.torch import TorchConfig
from elastic_train.worker import preemption
from elastic_train.worker.backend import WorkerResources
from elastic_train.worker.joined_session import JoinedSession
from elastic_train.worker.run_spec import RunSpec
from elastic_train.worker.session import CheckpointUploadMode, TrainSession


@pytest.fixture
def session_of_one(tmp_path, monkeypatch):
    monkeypatch.setattr(preemption, "install", lambda: None)  # keep pytest's SIGTERM
    run_config = et.RunConfig(storage_path=str(tmp_path / "results"), name="run")
    spec = RunSpec(None, None, TorchConfig(), et.ScalingConfig(num_workers=1), run_config,
                   "run")
    env = WorkerEnv(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0,
                    master_addr="127.0.0.1", master_port=0, restart_count=0,
                    use_agent_store=False, generation="")
    storage = RunStorage.open(run_config.storage_path, "run")
    storage.ensure_writable()
    calls = []

    def hook(name):
        return lambda iteration, env: calls.append((name, iteration, storage.read_metrics()))

    session = TrainSession(spec, env, WorkerResources([torch.device("cpu")], None), storage,
                           str(tmp_path / "staging"), join=False,
                           after_report=[hook("first"), hook("second")])
    yield session, storage, calls
    with contextlib.suppress(et.ConfigError):  # a test that made the run fail saw it already
        session.finish()


def test_join_returns_one_joined_session_with_the_committer_on_rank_0(session_of_one):
    session, _, _ = session_of_one
    joined = session.join()
    assert isinstance(joined, JoinedSession) and session.join() is joined
    assert joined.restored is None and joined.committer is not None
    assert joined.numbers.next_index == 0


def test_hooks_run_after_the_row_and_the_commit(session_of_one, tmp_path):
    session, storage, calls = session_of_one
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "model.pt").write_bytes(b"weights")
    session.report({"loss": 1.0})
    session.report({"loss": 0.5}, et.Checkpoint.from_directory(str(tmp_path / "ckpt")),
                   checkpoint_upload_mode=CheckpointUploadMode.SYNC)
    assert [(name, iteration, len(rows)) for name, iteration, rows in calls] == [
        ("first", 1, 1), ("second", 1, 1), ("first", 2, 2), ("second", 2, 2)]
    assert calls[-1][2][-1]["checkpoint_dir_name"] == "checkpoint_000000"
    [manifest] = storage.checkpoints.committed()
    assert (manifest.index, manifest.training_iteration, list(manifest.files)) == \
        (0, 2, ["model.pt"])
    assert session.get_checkpoint().path == storage.checkpoints.path(0)


def _checkpoint_dir(tmp_path, name, data=b"weights"):
    directory = tmp_path / name
    directory.mkdir()
    (directory / "model.pt").write_bytes(data)
    return et.Checkpoint.from_directory(str(directory))


@pytest.mark.parametrize("mode, delete, deleted", [
    (CheckpointUploadMode.ASYNC, None, True),   # Ray's default: True for ASYNC only
    (CheckpointUploadMode.SYNC, None, False),
    (CheckpointUploadMode.SYNC, True, True),
    (CheckpointUploadMode.ASYNC, False, False)])
def test_delete_local_checkpoint_after_upload_defaults_as_rays(session_of_one, tmp_path,
                                                                mode, delete, deleted):
    session, storage, _ = session_of_one
    checkpoint = _checkpoint_dir(tmp_path, "ckpt")
    session.report({"loss": 0.5}, checkpoint, checkpoint_upload_mode=mode,
                   delete_local_checkpoint_after_upload=delete)
    assert (tmp_path / "ckpt").exists() is not deleted  # gone when report() returns
    session.finish()
    [manifest] = storage.checkpoints.committed()
    assert list(manifest.files) == ["model.pt"]  # the staged copy went up


def test_get_all_reported_checkpoints_lists_what_retention_kept_plus_the_latest(
        session_of_one, tmp_path):
    session, storage, _ = session_of_one
    session.spec.run_config.checkpoint_config.num_to_keep = 2
    session.spec.run_config.checkpoint_config.checkpoint_score_attribute = "loss"
    session.spec.run_config.checkpoint_config.checkpoint_score_order = "min"
    assert session.get_all_reported_checkpoints() == []
    for step, loss in enumerate([0.3, 0.1, 0.2, 0.9]):
        session.report({"loss": loss}, _checkpoint_dir(tmp_path, f"c{step}"))
    reported = session.get_all_reported_checkpoints(et.CheckpointConsistencyMode.COMMITTED)
    # top-2 (0.1, 0.2) plus the latest (0.9), worst to best as Ray orders them
    assert [r.metrics["loss"] for r in reported] == [0.9, 0.2, 0.1]
    assert {r.status for r in reported} == {et.ReportedCheckpointStatus.COMMITTED}
    assert [r.checkpoint.path for r in reported] == [
        storage.checkpoints.path(i) for i in (3, 2, 1)]
    assert reported[0].checkpoint.get_commit_info().index == 3


def test_get_all_reported_checkpoints_checks_its_arguments(session_of_one):
    session, _, _ = session_of_one
    with pytest.raises(et.ConfigError, match=r"consistency_mode='SOON'.*COMMITTED"):
        session.get_all_reported_checkpoints("SOON")
    with pytest.raises(et.ConfigError, match=r"timeout_s=-1.*>= 0"):
        session.get_all_reported_checkpoints(timeout_s=-1)


def test_checkpoint_dir_name_names_the_directory_and_keeps_the_number(session_of_one,
                                                                      tmp_path):
    session, storage, calls = session_of_one
    session.report({"loss": 0.5}, _checkpoint_dir(tmp_path, "c0"), checkpoint_dir_name="epoch_0",
                   checkpoint_upload_mode=CheckpointUploadMode.SYNC)
    session.report({"loss": 0.4}, _checkpoint_dir(tmp_path, "c1"))
    session.finish()
    assert [row["checkpoint_dir_name"] for _, _, rows in calls[-1:] for row in rows] == [
        "epoch_0", "checkpoint_000001"]
    assert [(m.index, m.name) for m in storage.checkpoints.committed()] == [
        (0, "epoch_0"), (1, "checkpoint_000001")]
    assert [r.checkpoint.path.rsplit("/", 1)[-1]
            for r in session.get_all_reported_checkpoints()] == ["epoch_0", "checkpoint_000001"]
    with pytest.raises(et.ConfigError, match=r"checkpoint_dir_name='epoch_0'.*unique"):
        session.report({"loss": 0.3}, _checkpoint_dir(tmp_path, "c2"),
                       checkpoint_dir_name="epoch_0")
    assert (tmp_path / "c2" / "model.pt").exists()  # refused before anything was touched


def test_no_upload_commits_the_files_written_into_the_run_directory(session_of_one):
    session, storage, _ = session_of_one
    session.join()
    written = os.path.join(storage.run_path, "by_hand")
    os.makedirs(os.path.join(written, "sub"))
    for rel, data in (("model.pt", b"weights"), ("sub/opt.pt", b"optimizer")):
        with open(os.path.join(written, rel), "wb") as f:
            f.write(data)
    session.report({"loss": 0.5}, et.Checkpoint(written),
                   checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)
    [reported] = session.get_all_reported_checkpoints(timeout_s=0)  # committed on return
    manifest = reported.checkpoint.get_commit_info()
    assert (manifest.name, manifest.files) == ("by_hand", {
        rel: {**info, "rank": 0} for rel, info in scan_directory(written).items()})
    assert os.path.exists(os.path.join(written, "model.pt"))  # the user's files stay put


def _copy_into_run(run_path):
    """A checkpoint_upload_fn that copies the reported directory into ``<run>/<dir_name>``."""
    def upload(checkpoint, dir_name):
        shutil.copytree(checkpoint.path, os.path.join(run_path, dir_name))
        return et.Checkpoint(os.path.join(run_path, dir_name))
    return upload


def test_checkpoint_upload_fn_writes_the_files_and_the_commit_reads_them(session_of_one,
                                                                         tmp_path):
    session, storage, _ = session_of_one
    upload = _copy_into_run(storage.run_path)
    session.report({"loss": 0.5}, _checkpoint_dir(tmp_path, "c0"), checkpoint_upload_fn=upload,
                   checkpoint_upload_mode=et.CheckpointUploadMode.ASYNC)
    session.report({"loss": 0.4}, _checkpoint_dir(tmp_path, "c1"), checkpoint_dir_name="mine",
                   checkpoint_upload_fn=upload)
    session.get_all_reported_checkpoints(et.CheckpointConsistencyMode.COMMITTED)
    assert not (tmp_path / "c0").exists()  # an ASYNC asked for: deleted once uploaded
    assert (tmp_path / "c1").exists()  # the default mode keeps it, as Ray's SYNC would
    assert [(m.name, m.files["model.pt"]["size"]) for m in storage.checkpoints.committed()] == [
        ("checkpoint_000000", 7), ("mine", 7)]
    elsewhere = et.Checkpoint(str(tmp_path / "elsewhere"))
    with pytest.raises(et.ConfigError, match=r"returned Checkpoint\(.*elsewhere.*write the files"):
        session.report({"loss": 0.3}, _checkpoint_dir(tmp_path, "c2"),
                       checkpoint_upload_mode=et.CheckpointUploadMode.SYNC,
                       checkpoint_upload_fn=lambda checkpoint, name: elsewhere)
    with pytest.raises(et.ConfigError, match=r"returned Checkpoint"):  # the run fails with it
        session.finish()


def test_checkpoint_upload_fn_runs_off_the_training_thread_under_async(session_of_one,
                                                                        tmp_path):
    """As Ray's: the function may wait for a background save (the guide's async_save
    future) while report() has returned; the commit follows it."""
    session, storage, _ = session_of_one
    started, release = threading.Event(), threading.Event()
    copy = _copy_into_run(storage.run_path)

    def upload(checkpoint, dir_name):
        started.set()
        release.wait(10)
        return copy(checkpoint, dir_name)

    session.report({"loss": 0.5}, _checkpoint_dir(tmp_path, "c0"), checkpoint_upload_fn=upload)
    assert started.wait(5) and storage.checkpoints.committed() == []
    release.set()
    session.get_all_reported_checkpoints(et.CheckpointConsistencyMode.COMMITTED)
    assert [m.name for m in storage.checkpoints.committed()] == ["checkpoint_000000"]
