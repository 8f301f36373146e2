"""One rank's report() in-process (a world of one, no process group): join() returns the
joined session, rank 0's committer records the row and commits, and the after-report
hooks run once the report is done, in order."""

from __future__ import annotations

import pytest
import torch

import elastic_train as et
from elastic_train.context import WorkerEnv
from elastic_train.storage import RunStorage
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
                   CheckpointUploadMode.SYNC)
    assert [(name, iteration, len(rows)) for name, iteration, rows in calls] == [
        ("first", 1, 1), ("second", 1, 1), ("first", 2, 2), ("second", 2, 2)]
    assert calls[-1][2][-1]["checkpoint_dir_name"] == "checkpoint_000000"
    [manifest] = storage.checkpoints.committed()
    assert (manifest.index, manifest.training_iteration, list(manifest.files)) == \
        (0, 2, ["model.pt"])
    assert session.get_checkpoint().path == storage.checkpoints.path(0)
