"""Ray Train's checkpointing, asynchronous validation and "inspect results" guides, ported
with the imports changed (examples/ray_guide_*.py), run on 2 real workers: each part
does what the guide says it does."""

from __future__ import annotations

import logging
import os

import pytest

import elastic_train as et
from elastic_train._internal import ray_arguments
from elastic_train.storage import RunStorage
from tests.support.examples import load_example

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300),
              pytest.mark.usefixtures("no_leaked_processes")]


def _files(directory) -> list[str]:
    """What a directory holds, without our dot-files (commit marker, leases)."""
    return sorted(n for n in os.listdir(directory) if not n.startswith("."))


def _ignored(caplog) -> list[str]:
    """The Ray arguments the driver warned of as ignored, sorted."""
    return sorted(r.getMessage().split(" is ignored: ")[0] for r in caplog.records
                  if r.name == ray_arguments.__name__)


def _run(tmp_path, name: str) -> et.RunConfig:
    return et.RunConfig(name=name, storage_path=str(tmp_path / "results"))


def test_checkpoints_guide(tmp_path):
    guide = load_example("ray_guide_checkpoints")
    saved = guide.run_save(_run(tmp_path, "save"))
    assert len(saved.metrics_dataframe) == 5 and saved.checkpoint is not None
    with saved.checkpoint.as_directory() as d:
        assert _files(d) == ["model.pt"]  # rank 0's unwrapped model
    # every rank's file in one checkpoint
    spread = guide.run_distributed(_run(tmp_path, "distributed"))
    assert sorted(os.listdir(spread.checkpoint.to_directory())) == [
        "model-rank=0.pt", "model-rank=1.pt"]
    assert guide.inspect_checkpoint(str(tmp_path / "test-checkpoint")) == ["model.pt"]
    # SYNC from a TemporaryDirectory, then ASYNC from mkdtemp(), deleted once staged
    modes = guide.run_upload_modes(_run(tmp_path, "modes"))
    assert list(modes.metrics_dataframe["mode"]) == ["SYNC", "ASYNC"]
    assert modes.return_value is False
    # DCP shards written into <run>/<epoch> by every rank, reported with NO_UPLOAD
    in_place = guide.run_no_upload(_run(tmp_path, "no_upload"))
    assert os.path.basename(in_place.checkpoint.path) == "1"
    assert sorted(os.listdir(in_place.checkpoint.path)) == [
        ".commit.json", ".metadata", "__0_0.distcp", "__1_0.distcp"]
    # dcp.async_save into <run>/<epoch>, committed once checkpoint_upload_fn waited for it
    custom = guide.run_custom_upload(_run(tmp_path, "custom_upload"))
    committed = RunStorage(custom.filesystem, custom.path).checkpoints.committed()
    assert [m.name for m in committed] == ["0", "1"]
    assert sorted(committed[-1].files) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    # COMMITTED lists them pending; VALIDATED waits for the validation metrics
    listed = guide.run_all_reported(_run(tmp_path, "all_reported")).return_value
    assert [status for status, _ in listed["committed"]][-1] == "PENDING_VALIDATION"
    assert listed["validated"] == [("VALIDATED", 0.0), ("VALIDATED", 1.0)]


def test_checkpoints_guide_restore_resumes_after_its_intentional_error(tmp_path):
    """The guide raises at epoch 1 with max_failures=1 and resumes at epoch 2: under our
    ASYNC default, the epoch-1 checkpoint still uploading when the error came is finished
    before the in-process restart (it was dropped in 2 of 3 runs: the run resumed at
    epoch 1 and raised again)."""
    guide = load_example("ray_guide_checkpoints")
    result = guide.run_restore(_run(tmp_path, "restore"))
    assert list(result.metrics_dataframe["start_epoch"]) == [0, 0, 2, 2, 2]


def test_async_validation_guide_scores_each_checkpoint_off_the_training_path(tmp_path,
                                                                             caplog):
    """With the guide's accelerator_type and ValidationConfig(ray_remote_kwargs=...): one
    warning each for what only places Ray's task and actors."""
    caplog.set_level(logging.WARNING, logger=ray_arguments.__name__)
    guide = load_example("ray_guide_async_validation")
    result = guide.run_trainer(epochs=3, run_config=_run(tmp_path, "async_validation"))
    assert _ignored(caplog) == [
        "ScalingConfig(accelerator_type='A100')",
        "ValidationConfig(ray_remote_kwargs['num_cpus']=1)"]
    rows = result.metrics_dataframe
    assert list(rows["epoch"].dropna()) == [0, 1, 2]
    scores = list(rows.dropna(subset=["epoch"])["score"])
    assert all(0.0 < s <= 1.0 for s in scores) and scores[-1] > 0.8, scores
    statuses = [m.validation["status"] for m in
                RunStorage(result.filesystem, result.path).checkpoints.committed()]
    assert statuses == ["VALIDATED"] * 3


@pytest.mark.long
def test_async_validation_guide_with_a_distributed_validation_function(tmp_path, monkeypatch):
    """The validation function runs a TorchTrainer of its own, named after the epoch,
    under the default storage path (HOME is the test's)."""
    pytest.importorskip("torchmetrics")
    monkeypatch.setenv("HOME", str(tmp_path))
    guide = load_example("ray_guide_async_validation")
    result = guide.run_trainer(epochs=2, distributed_validation=True,
                               run_config=_run(tmp_path, "train"))
    losses = list(result.metrics_dataframe.dropna(subset=["epoch"])["score"])
    assert len(losses) == 2 and losses[1] < losses[0]  # a validation loss, falling
    runs = _files(tmp_path / "elastic_train_results")
    assert runs == ["train_validation_epoch_0", "train_validation_epoch_1"]


def test_inspect_results_guide(tmp_path):
    guide = load_example("ray_guide_results")
    seen = guide.inspect_results(_run(tmp_path, "results"))
    assert seen["metrics"]["loss"] == 2 and seen["minimum_loss"] == 0
    assert seen["last_files"] == seen["best_files"] == ["model.pt"]
    assert os.path.basename(seen["best_path"]) == "checkpoint_000000"
    assert seen["path"] == str(tmp_path / "results" / "results")
    assert seen["restored_loss"] == 2
    assert "Simulated training error" in seen["failures"][0].message


def test_scaling_guide_runs_with_its_scheduling_hints_warned_once_each(tmp_path, caplog):
    """ScalingConfig(placement_strategy="SPREAD", accelerator_type="A100",
    trainer_resources={"CPU": 0}) and FailureConfig(fail_fast=True) port as they are:
    one warning per hint, in the driver; worker_runtime_env's variable in every rank,
    kept out of what restore() reads; fail_fast recorded as max_failures=0."""
    caplog.set_level(logging.WARNING, logger=ray_arguments.__name__)
    result = load_example("ray_guide_scaling").run_job(str(tmp_path / "results"))
    assert result.error is None and list(result.metrics_dataframe["step"]) == [0, 1, 2]
    assert result.return_value["ranks"] == [{"device": "cpu", "NCCL_SOCKET_IFNAME": "lo"}] * 2
    assert _ignored(caplog) == ["ScalingConfig(accelerator_type='A100')",
                      "ScalingConfig(placement_strategy='SPREAD')",
                      "ScalingConfig(trainer_resources={'CPU': 0})"]
    storage = RunStorage(result.filesystem, result.path)
    assert storage.read_run_state().spec["failure_config"]["max_failures"] == 0
    assert storage.read_trainable().run_config.worker_env_vars == {}
