"""End-to-end: Ray 2.60's checkpoint API on 2 real workers -- report(checkpoint_dir_name=,
delete_local_checkpoint_after_upload=) and get_all_reported_checkpoints(), through a
worker's death and the resume from a custom-named checkpoint."""

from __future__ import annotations

import os
import signal
import tempfile
from typing import Any

import pytest

import elastic_train as et
from elastic_train.torch import TorchTrainer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180),
              pytest.mark.usefixtures("no_leaked_processes")]

SCORES = [1.0, 5.0, 4.0, 2.0]  # the last epoch's is not among the best two


def _in_run(name: str) -> tuple[Any, str]:
    """The run's filesystem and the path of its directory ``name`` (local disk or S3)."""
    storage = et.get_context().get_storage()
    return storage.storage_filesystem, f"{storage.experiment_fs_path}/{name}"


def _copy_into_run(checkpoint: et.Checkpoint, dir_name: str) -> et.Checkpoint:
    """A checkpoint_upload_fn: the files into the run's directory ``dir_name``."""
    fs, target = _in_run(dir_name)
    fs.makedirs(target, exist_ok=True)
    fs.put(f"{checkpoint.path}/epoch.txt", f"{target}/epoch.txt")
    return et.Checkpoint(target, fs)


def _named_epochs(config: dict) -> dict:
    """Each epoch rank 0 reports a checkpoint named ``epoch_N`` from a fresh directory
    (odd epochs SYNC, kept; even ones ASYNC, deleted once staged) -- or, with
    ``how="no_upload"``, written into the run directory by hand (Ray's NO_UPLOAD), or
    with ``how="upload_fn"`` copied there by a checkpoint_upload_fn; rank 1 dies
    once at the start of epoch 2. Returns what get_all_reported_checkpoints() says on
    this rank, and which directories survived."""
    rank = et.get_context().get_world_rank()
    start = 0
    if (checkpoint := et.get_checkpoint()) is not None:
        with checkpoint.as_directory() as d, open(os.path.join(d, "epoch.txt")) as f:
            start = int(f.read()) + 1
        with open(config["starts"], "a") as f:
            f.write(f"{rank}:{os.path.basename(checkpoint.path)}\n")
    reported = []
    for epoch in range(start, len(SCORES)):
        if epoch == 2 and rank == 1 and not os.path.exists(config["marker"]):
            open(config["marker"], "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        name, checkpoint = f"epoch_{epoch}", None
        mode = et.CheckpointUploadMode.SYNC if epoch % 2 else et.CheckpointUploadMode.ASYNC
        no_upload = config["how"] == "no_upload"
        if no_upload:
            mode = et.CheckpointUploadMode.NO_UPLOAD
        if rank == 0 and no_upload:  # written into the run directory by hand
            fs, path = _in_run(name)
            fs.makedirs(path, exist_ok=True)
            fs.pipe(f"{path}/epoch.txt", str(epoch).encode())
            checkpoint = et.Checkpoint(path, fs)
        elif rank == 0:
            local = tempfile.mkdtemp()
            with open(os.path.join(local, "epoch.txt"), "w") as f:
                f.write(str(epoch))
            checkpoint = et.Checkpoint.from_directory(local)
        et.report({"score": SCORES[epoch], "epoch": epoch}, checkpoint=checkpoint,
                  checkpoint_dir_name=None if no_upload else name,
                  checkpoint_upload_mode=mode,
                  checkpoint_upload_fn=_copy_into_run if config["how"] == "upload_fn" else None)
        if checkpoint is not None:
            reported.append((epoch, checkpoint))
    listed = et.get_all_reported_checkpoints(et.CheckpointConsistencyMode.COMMITTED)
    # Once committed, as Ray's: an upload_fn's ASYNC deletes after the function ran.
    left_behind = [epoch for epoch, c in reported if c.filesystem.exists(c.path)]
    return {"rank": rank, "left_behind": left_behind,
            "listed": [(os.path.basename(r.checkpoint.path), r.metrics["epoch"], r.status.value)
                       for r in listed]}


@pytest.mark.parametrize("how", ["default", "no_upload", "upload_fn"])
def test_named_checkpoints_resume_retain_and_list_as_rays(storage, tmp_path, how):
    """On S3 the restart reads epoch_1 through the node's local tier, kept by index."""
    result = TorchTrainer(
        _named_epochs, train_loop_config={"starts": str(tmp_path / "starts"),
                                          "marker": str(tmp_path / "killed"),
                                          "how": how},
        scaling_config=et.ScalingConfig(num_workers=2),
        run_config=storage.run_config(
            "named", failure_config=et.FailureConfig(max_failures=1),
            checkpoint_config=et.CheckpointConfig(num_to_keep=2,
                                                  checkpoint_score_attribute="score"))).fit()
    # epoch_1 was committed before report() returned (SYNC; NO_UPLOAD and upload_fn
    # always): the restart resumes there
    assert sorted((tmp_path / "starts").read_text().split()) == ["0:epoch_1", "1:epoch_1"]
    # top-2 by score (epochs 1, 2) plus the latest (3), worst to best as Ray lists them
    assert result.return_value["listed"] == [("epoch_3", 3, "COMMITTED"),
                                             ("epoch_2", 2, "COMMITTED"),
                                             ("epoch_1", 1, "COMMITTED")]
    # ASYNC's default deletes, SYNC's keeps; NO_UPLOAD's directories are the checkpoints
    assert result.return_value["left_behind"] == ([2, 3] if how == "no_upload" else [3])
    assert os.path.basename(result.checkpoint.path) == "epoch_3"
    assert sorted(os.path.basename(c.path) for c, _ in result.best_checkpoints) == [
        "epoch_1", "epoch_2"]
    result.filesystem.invalidate_cache()
    on_disk = sorted(p.rsplit("/", 1)[-1] for p in result.filesystem.ls(result.path, detail=False)
                     if p.rsplit("/", 1)[-1].startswith("epoch_"))
    assert on_disk == ["epoch_1", "epoch_2", "epoch_3"]
    assert list(result.metrics_dataframe["checkpoint_dir_name"]) == [
        "epoch_0", "epoch_1", "epoch_2", "epoch_3"]


def _no_upload_from(config: dict) -> dict:
    """Each epoch only rank ``writer`` writes ``epoch_N`` into the run directory by hand and
    reports it with NO_UPLOAD; the other rank reports None (``clash``: its own directory).
    Resumes from the last checkpoint, killed once at the start of epoch 2."""
    rank = et.get_context().get_world_rank()
    start = 0
    if (checkpoint := et.get_checkpoint()) is not None:
        with checkpoint.as_directory() as d, open(os.path.join(d, "epoch.txt")) as f:
            start = int(f.read()) + 1
    for epoch in range(start, 3):
        if epoch == 2 and rank == 0 and not os.path.exists(config["marker"]):
            open(config["marker"], "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        checkpoint = None
        if rank == config["writer"] or config.get("clash"):
            fs, path = _in_run(f"epoch_{epoch}" + ("" if rank == config["writer"] else "_mine"))
            fs.makedirs(path, exist_ok=True)
            fs.pipe(f"{path}/epoch.txt", str(epoch).encode())
            checkpoint = et.Checkpoint(path, fs)
        et.report({"epoch": epoch}, checkpoint=checkpoint,
                  checkpoint_upload_mode=et.CheckpointUploadMode.NO_UPLOAD)
    return {"start": start}


def test_no_upload_reported_by_a_rank_other_than_zero_alone_is_the_checkpoint(storage_path,
                                                                               tmp_path):
    """Ray takes the first checkpoint any rank reported; rank 1 alone may report its
    NO_UPLOAD directory, which is then committed, listed and resumed from."""
    result = TorchTrainer(
        _no_upload_from, train_loop_config={"writer": 1, "marker": str(tmp_path / "killed")},
        scaling_config=et.ScalingConfig(num_workers=2),
        run_config=et.RunConfig(storage_path=storage_path, name="rank1",
                                failure_config=et.FailureConfig(max_failures=1))).fit()
    assert result.error is None
    assert result.return_value == {"start": 2}  # resumed after epoch_1's commit
    assert os.path.basename(result.checkpoint.path) == "epoch_2"
    with result.checkpoint.as_directory() as d, open(os.path.join(d, "epoch.txt")) as f:
        assert f.read() == "2"
    assert list(result.metrics_dataframe["checkpoint_dir_name"]) == [
        "epoch_0", "epoch_1", "epoch_2"]


def test_no_upload_directories_that_differ_between_ranks_are_refused(storage_path, tmp_path):
    trainer = TorchTrainer(
        _no_upload_from, train_loop_config={"writer": 1, "clash": True,
                                            "marker": str(tmp_path / "killed")},
        scaling_config=et.ScalingConfig(num_workers=2),
        run_config=et.RunConfig(storage_path=storage_path, name="clash"))
    with pytest.raises(et.TrainingFailedError,
                       match="the ranks reported different directories of the run"):
        trainer.fit()
