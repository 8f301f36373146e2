"""End-to-end: preemption notices (SIGTERM) give a just-in-time checkpoint, and the
restart that follows the reclaim spends the preemption budget, not max_failures."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

import elastic_train as et
from elastic_train.torch import TorchTrainer
from tests.conftest import EPOCHS, pid_alive, stop_driver_after_commit, wait_until
from tests.support import jobs
from tests.support.paths import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180),
              pytest.mark.usefixtures("no_leaked_processes")]


class _Reclaimer:
    """Plays the scheduler: SIGKILLs the notified worker once its job saved the JIT checkpoint."""

    def __init__(self, tmp_path):
        self.pid_file = tmp_path / "preempted.pid"
        self.jit_file = tmp_path / "jit"

    def run(self) -> None:
        import threading

        def reclaim() -> None:
            if wait_until(lambda: self.jit_file.exists() and self.pid_file.exists(), 120):
                os.kill(int(self.pid_file.read_text()), signal.SIGKILL)

        threading.Thread(target=reclaim, daemon=True).start()


def _fit_with_preemption(storage_path, tmp_path, name, failure_config):
    reclaimer = _Reclaimer(tmp_path)
    reclaimer.run()
    fault = {"rank": 1, "epoch": 2, "batch": 1, "how": "preempt",
             "pid_file": str(reclaimer.pid_file), "marker": str(tmp_path / "m")}
    starts = tmp_path / "starts"
    trainer = TorchTrainer(
        jobs.train_mlp,
        train_loop_config={"epochs": EPOCHS, "fault": fault, "watch_preemption": True,
                           "jit_file": str(reclaimer.jit_file), "step_sleep": 0.1,
                           "starts_file": str(starts)},
        scaling_config=et.ScalingConfig(num_workers=2),
        run_config=et.RunConfig(storage_path=storage_path, name=name,
                                failure_config=failure_config),
        datasets={"train": jobs.make_dataset()},
    )
    return trainer, starts


def test_worker_preemption_saves_jit_checkpoint_and_spends_preemption_budget(
        storage_path, tmp_path, baseline):
    trainer, starts = _fit_with_preemption(storage_path, tmp_path, "preempt",
                                           et.FailureConfig(max_failures=0))
    result = trainer.fit()
    # The restart resumed inside epoch 2, at the just-in-time checkpoint, not at epoch 2's start.
    assert starts.read_text().split() == ["0", "2"]
    assert result.return_value["digest"] == baseline.return_value["digest"]
    rows = result.metrics_dataframe
    jit = rows[rows["jit"] == 1]
    assert len(jit) == 1 and int(jit["epoch"].iloc[0]) == 2
    with open(os.path.join(result.path, "run.json")) as f:
        failures = json.load(f)["failures"]
    assert [f["kind"] for f in failures] == ["preemption"]
    assert failures[0]["workers"][0]["signal"] == "SIGKILL"


def test_preemption_budget_spent_raises_preemption_error(storage_path, tmp_path):
    trainer, _ = _fit_with_preemption(storage_path, tmp_path, "preempt-budget",
                                      et.FailureConfig(max_failures=3,
                                                       max_preemption_failures=0))
    with pytest.raises(et.PreemptionError) as info:
        trainer.fit()
    assert "max_preemption_failures=0" in str(info.value)
    assert isinstance(info.value, et.TrainingFailedError)


def test_driver_sigterm_gives_workers_grace_for_a_jit_checkpoint(storage_path, tmp_path):
    """SIGTERM to the driver (a node reclaimed): the workers get the notice, commit a
    just-in-time checkpoint within the grace period, and restore continues from it."""
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    args = [sys.executable, "-m", "tests.e2e.scripts.driver", storage_path, "driver-term",
            str(pid_dir), "8", "0.3", "6"]
    cwd = REPO
    driver = subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    run_dir = os.path.join(storage_path, "driver-term")
    workers = stop_driver_after_commit(driver, run_dir, 0, signal.SIGTERM, pid_dir)
    assert driver.returncode != 0
    assert wait_until(lambda: not any(pid_alive(p) for p in workers), 30), "orphaned workers"
    assert (pid_dir / "jit").exists(), "no just-in-time checkpoint within the grace period"
    jit_epoch = int((pid_dir / "jit").read_text().split()[0])
    with open(os.path.join(run_dir, "run.json")) as f:
        assert json.load(f)["status"] == "interrupted"
    rows = et.Result.from_path(run_dir).metrics_dataframe
    jit = rows[rows["jit"] == 1]
    assert len(jit) == 1  # committed (SYNC) before report() returned, then training went on
    assert os.path.exists(os.path.join(run_dir, jit["checkpoint_dir_name"].iloc[0],
                                       ".commit.json"))

    resumed = subprocess.Popen(args[:-1], cwd=cwd, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    out, _ = resumed.communicate(timeout=150)
    assert resumed.returncode == 0, out
    assert int((pid_dir / "starts").read_text().split()[-1]) >= jit_epoch
