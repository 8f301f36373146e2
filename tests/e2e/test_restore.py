"""Restoring interrupted runs: driver SIGKILLed then TorchTrainer.restore / the CLI,
restore from S3, two worker kills within one epoch with mid-epoch checkpoints."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

import elastic_train as et
from elastic_train.torch import TorchTrainer
from tests.conftest import REPO, fit, start_driver, stop_driver_after_commit
from tests.support import jobs

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300),
              pytest.mark.usefixtures("no_leaked_processes")]

def kill_driver_after_checkpoint(storage_path, name, pid_dir, index=2):
    proc = start_driver(storage_path, name, pid_dir)
    stop_driver_after_commit(proc, os.path.join(storage_path, name), index, signal.SIGKILL)


@pytest.mark.parametrize("how", ["api", "cli"])
def test_restore_after_driver_sigkill_is_bit_identical(storage_path, tmp_path, how,
                                                       driver_digest):
    pids = tmp_path / "pids"
    pids.mkdir()
    kill_driver_after_checkpoint(storage_path, "killed", pids)
    run_path = os.path.join(storage_path, "killed")
    assert TorchTrainer.can_restore(run_path)
    if how == "api":
        result = TorchTrainer.restore(run_path).fit()
        assert result.return_value["digest"] == driver_digest
    else:
        cli = subprocess.run([sys.executable, "-m", "elastic_train.cli", "restore", run_path],
                             cwd=REPO, capture_output=True, text=True, timeout=200)
        assert cli.returncode == 0, cli.stdout + cli.stderr
        result = et.Result.from_path(run_path)
    assert jobs.checkpoint_digest(result.checkpoint) == driver_digest
    assert list(result.metrics_dataframe["training_iteration"]) == list(range(1, 9))
    assert not TorchTrainer.can_restore(run_path)  # finished now
    state = result_state(run_path)
    assert state["status"] == "finished" and len(state["launches"]) == 2


def result_state(run_path):
    from elastic_train.storage import RunStorage
    from elastic_train.storage import filesystem as fsutil

    fs, path = fsutil.resolve(run_path)
    return RunStorage(fs, path).read_run_state()


def test_can_restore_and_start_over_of_a_finished_run(storage_path, tmp_path):
    assert not TorchTrainer.can_restore(tmp_path / "missing")
    assert not TorchTrainer.can_restore(tmp_path)  # a directory, not a run
    first = fit(storage_path, "done", config={"epochs": 1})
    run_path = os.path.join(storage_path, "done")
    assert not TorchTrainer.can_restore(run_path)
    with pytest.raises(et.ConfigError, match=r"already finished.*RunConfig\(start_over=True\)"):
        fit(storage_path, "done", config={"epochs": 1})
    starts = tmp_path / "starts"
    again = fit(storage_path, "done", config={"epochs": 1, "starts_file": str(starts)},
                start_over=True)
    assert starts.read_text().split() == ["0"]  # from scratch, not from the final checkpoint
    assert again.return_value["digest"] == first.return_value["digest"]
    assert list(again.metrics_dataframe["training_iteration"]) == [1]
    assert len(result_state(run_path)["launches"]) == 1
    archived = [p for p in os.listdir(storage_path) if p.startswith("done.finished-")]
    assert len(archived) == 1  # the finished run, moved aside whole
    old = et.Result.from_path(os.path.join(storage_path, archived[0]))
    assert jobs.checkpoint_digest(old.checkpoint) == first.return_value["digest"]
    assert result_state(os.path.join(storage_path, archived[0]))["status"] == "finished"


def test_restore_from_s3_after_failure(storage, tmp_path, baseline):
    if storage.options is None:
        pytest.skip("covered on local disk by the driver tests")
    fault = {"rank": 1, "epoch": 2, "how": "raise", "marker": str(tmp_path / "m")}
    with pytest.raises(et.TrainingFailedError):
        fit(storage, "s3-restore", config={"fault": fault, "upload_mode": "SYNC"})
    url = f"{storage.url}/s3-restore"
    assert TorchTrainer.can_restore(url, storage_options=storage.options)
    result = TorchTrainer.restore(url, storage_options=storage.options).fit()
    assert result.return_value["digest"] == baseline.return_value["digest"]
    assert list(result.metrics_dataframe["training_iteration"]) == list(range(1, 6))


def test_two_kills_in_one_epoch_with_mid_epoch_checkpoints(storage_path, tmp_path):
    """The data position is part of each mid-epoch checkpoint: resumes are exact."""
    config = {"checkpoint_every_batches": 2, "upload_mode": "SYNC"}
    straight = fit(storage_path, "mid-straight", config=config)
    starts = tmp_path / "starts"
    faults = [{"rank": 1, "epoch": 2, "batch": 3, "how": "sigkill", "marker": str(tmp_path / "a")},
              {"rank": 0, "epoch": 2, "batch": 5, "how": "sigkill", "marker": str(tmp_path / "b")}]
    result = fit(storage_path, "mid-killed", max_failures=2,
                 config={**config, "faults": faults, "starts_file": str(starts)})
    assert starts.read_text().split() == ["0", "2", "2"]
    assert result.return_value["digest"] == straight.return_value["digest"]
    rows = result.metrics_dataframe
    assert list(rows["training_iteration"]) == list(straight.metrics_dataframe[
        "training_iteration"])


def test_restore_with_a_new_train_function_and_a_changed_one(storage_path, tmp_path):
    fault = {"rank": 0, "epoch": 1, "how": "raise", "marker": str(tmp_path / "m")}
    with pytest.raises(et.TrainingFailedError):
        fit(storage_path, "changed", config={"fault": fault})
    with pytest.raises(et.ConfigError, match="train function: tests.support.jobs.train_mlp -> "):
        TorchTrainer(lambda: None, run_config=et.RunConfig(
            storage_path=storage_path, name="changed")).fit()
    result = TorchTrainer.restore(os.path.join(storage_path, "changed"),
                                  train_loop_per_worker=jobs.train_mlp).fit()
    assert result.metrics["training_iteration"] == 5
