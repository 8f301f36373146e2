"""End-to-end: Ray 2.60's asynchronous validation on 2 real workers --
``TorchTrainer(validation_config=ValidationConfig(fn, ValidationTaskConfig(...)))`` and
``report(..., validation=True | ValidationTaskConfig(...))``: the function runs in a
process of its own on committed checkpoints while training goes on, its metrics land in
the checkpoint's row and drive retention, failures and timeouts are reported without
stopping training, and ``get_all_reported_checkpoints(VALIDATED)`` waits for it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

import elastic_train as et
from elastic_train import collective
from elastic_train.storage import RunStorage
from elastic_train.torch import TorchTrainer
from tests.conftest import pid_alive, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240),
              pytest.mark.usefixtures("no_leaked_processes")]

VAL_SCORES = [1.0, 5.0, 4.0, 2.0]  # the last epoch's is not among the best two


def _checkpoint_of(epoch: int) -> et.Checkpoint | None:
    """Rank 0's checkpoint of ``epoch`` (a file naming it); None on the other ranks."""
    if et.get_context().get_world_rank() != 0:
        return None
    local = tempfile.mkdtemp()
    with open(os.path.join(local, "epoch.txt"), "w") as f:
        f.write(str(epoch))
    return et.Checkpoint.from_directory(local)


def _epoch_of(checkpoint: et.Checkpoint) -> int:
    with checkpoint.as_directory() as d, open(os.path.join(d, "epoch.txt")) as f:
        return int(f.read())


def _score_by_epoch(checkpoint: et.Checkpoint, pid_file: str, scores: list) -> dict:
    """The validation function: the epoch's score, under a new name and over the
    training's ``score``; notes the process it ran in."""
    with open(pid_file, "a") as f:
        f.write(f"{os.getpid()}\n")
    epoch = _epoch_of(checkpoint)
    return {"val_score": scores[epoch], "score": 100.0 + epoch}


def _report_validated(config: dict) -> dict:
    """Each epoch reports a checkpoint with validation; the first epoch's listing with
    COMMITTED sees it pending, VALIDATED sees it validated."""
    seen = {}
    for epoch in range(len(VAL_SCORES)):
        checkpoint = _checkpoint_of(epoch)
        validation = et.ValidationTaskConfig(fn_kwargs={"scores": VAL_SCORES}) \
            if epoch % 2 else True
        et.report({"score": -1.0, "epoch": epoch}, checkpoint=checkpoint,
                  checkpoint_upload_mode=et.CheckpointUploadMode.SYNC,
                  validation=validation if checkpoint else False)  # Ray's rule
        if epoch == 0:
            seen["committed"] = [r.status.value for r in et.get_all_reported_checkpoints(
                et.CheckpointConsistencyMode.COMMITTED)]
            seen["validated"] = [(r.status.value, r.metrics.get("val_score"))
                                 for r in et.get_all_reported_checkpoints()]
    seen["worker_pid"] = os.getpid()
    return seen


def test_validation_metrics_land_in_the_row_and_drive_retention(storage, tmp_path):
    pid_file = str(tmp_path / "validation_pids")
    result = TorchTrainer(
        _report_validated, scaling_config=et.ScalingConfig(num_workers=2),
        validation_config=et.ValidationConfig(
            _score_by_epoch, task_config=et.ValidationTaskConfig(
                fn_kwargs={"pid_file": pid_file, "scores": [0.0] * len(VAL_SCORES)})),
        run_config=storage.run_config(
            "validated", checkpoint_config=et.CheckpointConfig(
                num_to_keep=2, checkpoint_score_attribute="val_score"))).fit()
    seen = result.return_value
    # the function's own process, once per checkpoint, never a worker's
    pids = (tmp_path / "validation_pids").read_text().split()
    assert len(pids) == 4 and str(seen["worker_pid"]) not in pids
    # epoch 0's validation takes a process start: COMMITTED does not wait for it
    assert seen["committed"] == ["PENDING_VALIDATION"]
    # validation=True used the defaults (all scores 0.0); VALIDATED waited for it
    assert seen["validated"] == [("VALIDATED", 0.0)]
    # ValidationTaskConfig's fn_kwargs overrode the defaults (odd epochs): scores 5.0
    # and 2.0; epochs 0 and 2 scored 0.0. Top-2 by val_score: epochs 1 and 3 (the
    # latest); epoch 0 and 2 deleted although epoch 2 is later than epoch 1.
    rows = result.metrics_dataframe
    assert list(rows["val_score"]) == [0.0, 5.0, 0.0, 2.0]
    assert list(rows["score"]) == [100.0, 101.0, 102.0, 103.0]  # overwritten, as Ray's
    assert sorted(_epoch_of(c) for c, _ in result.best_checkpoints) == [1, 3]
    assert [m["val_score"] for _, m in result.best_checkpoints] == [5.0, 2.0]
    run = RunStorage(result.filesystem, result.path)
    committed = run.checkpoints.committed()
    assert [(m.index, m.validation["status"]) for m in committed] == [
        (1, "VALIDATED"), (3, "VALIDATED")]
    assert result.metrics["val_score"] == 2.0


def _sleepy_validation(checkpoint: et.Checkpoint, times_file: str, sleep_s: float) -> dict:
    """Notes when it started and ended, sleeping ``sleep_s`` between."""
    with open(times_file, "a") as f:
        f.write(json.dumps({"start": time.time()}) + "\n")
    time.sleep(sleep_s)
    with open(times_file, "a") as f:
        f.write(json.dumps({"end": time.time()}) + "\n")
    return {"val_loss": 0.5}


def _steps_while_validating(config: dict) -> list:
    """One checkpoint with a slow validation, then steps of 0.1 s, each reported, until
    the validation has ended (rank 0 tells the others); returns when each step's report
    returned (rank 0)."""
    checkpoint = _checkpoint_of(0)
    et.report({"step": 0}, checkpoint=checkpoint, validation=checkpoint is not None)
    times = []
    for step in range(1, 1200):
        time.sleep(0.1)
        et.report({"step": step})
        times.append(time.time())
        ended = os.path.exists(config["times_file"]) and "end" in open(config["times_file"]).read()
        if collective.broadcast_from_rank_zero(ended):
            break
    return times


def test_training_steps_go_on_while_a_slow_validation_runs(tmp_path):
    times_file = str(tmp_path / "validation_times")
    result = TorchTrainer(
        _steps_while_validating, train_loop_config={"times_file": times_file},
        scaling_config=et.ScalingConfig(num_workers=2),
        validation_config=et.ValidationConfig(_sleepy_validation, et.ValidationTaskConfig(
            fn_kwargs={"times_file": times_file, "sleep_s": 3.0})),
        run_config=et.RunConfig(name="slow", storage_path=str(tmp_path / "results"))).fit()
    marks = [json.loads(line) for line in open(times_file)]
    start, end = marks[0]["start"], marks[1]["end"]
    during = [t for t in result.return_value if start < t < end]
    # 3 s of validation, steps of >= 0.1 s: the steps went on throughout it
    assert len(during) >= 10, (start, end, result.return_value)
    # fit() returned only once the validation was recorded
    assert result.metrics_dataframe["val_loss"].iloc[0] == 0.5
    assert result.checkpoint.get_commit_info() is not None


def _failing_validation(checkpoint: et.Checkpoint, how: str, pid_file: str) -> dict:
    if how == "raise":
        raise RuntimeError("the validation set is missing")
    if how == "sleep":  # and a process in a session of its own (a nested trainer's zygote)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                 start_new_session=True)
        with open(pid_file, "w") as f:
            f.write(f"{child.pid}\n")
        time.sleep(60)
    if how == "not a dict":
        return [1.0]
    return {"val_loss": 0.25}


def _three_outcomes(config: dict) -> dict:
    for epoch, how in enumerate(["raise", "sleep", "not a dict", "ok"]):
        checkpoint = _checkpoint_of(epoch)
        et.report({"loss": float(epoch)}, checkpoint=checkpoint,
                  validation=checkpoint is not None and et.ValidationTaskConfig(
                      fn_kwargs={"how": how, "pid_file": config["pid_file"]},
                      timeout_s=8.0 if how == "sleep" else None))
    return {"listed": [(r.metrics["loss"], r.status.value, r.metrics.get("val_loss"))
                       for r in et.get_all_reported_checkpoints()]}


def test_a_failing_or_slow_validation_is_reported_and_training_goes_on(tmp_path, capfd):
    pid_file = tmp_path / "started"
    started = time.monotonic()
    result = TorchTrainer(
        _three_outcomes, train_loop_config={"pid_file": str(pid_file)},
        scaling_config=et.ScalingConfig(num_workers=2),
        validation_config=et.ValidationConfig(_failing_validation),
        run_config=et.RunConfig(name="failing", storage_path=str(tmp_path / "results"))).fit()
    assert time.monotonic() - started < 50  # the 60 s sleep was cut at timeout_s
    assert result.error is None
    assert result.return_value["listed"] == [
        (0.0, "VALIDATION_FAILED", None), (1.0, "VALIDATION_TIMEOUT", None),
        (2.0, "VALIDATION_FAILED", None), (3.0, "VALIDATED", 0.25)]
    errors = [m.validation.get("error", "") for m in
              RunStorage(result.filesystem, result.path).checkpoints.committed()]
    assert "RuntimeError: the validation set is missing" in errors[0]
    assert "timeout_s=8.0" in errors[1]
    assert "must return a dictionary of metrics" in errors[2]
    out = capfd.readouterr()
    assert "VALIDATION_FAILED" in out.out + out.err
    assert "RuntimeError: the validation set is missing" in out.out + out.err
    # the slow one's process, killed at its timeout, took what it started with it
    left = [pid for pid in map(int, pid_file.read_text().split()) if pid_alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes the timed-out validation started were left: {left}"


def test_validation_without_a_validation_config_fails_the_report(tmp_path):
    def train(config):
        et.report({"loss": 1.0}, checkpoint=_checkpoint_of(0), validation=True)

    with pytest.raises(et.TrainingFailedError, match="validation_config` was not set"):
        TorchTrainer(train, scaling_config=et.ScalingConfig(num_workers=1),
                     run_config=et.RunConfig(name="none",
                                             storage_path=str(tmp_path / "results"))).fit()


def _noted_validation(checkpoint: et.Checkpoint, log: str, sleep_s: float) -> dict:
    """Notes each start and end, by the checkpoint's epoch."""
    epoch = _epoch_of(checkpoint)
    with open(log, "a") as f:
        f.write(f"start {epoch}\n")
    time.sleep(sleep_s)
    with open(log, "a") as f:
        f.write(f"end {epoch}\n")
    return {"val_epoch": epoch}


def _fails_while_validating(config: dict) -> None:
    """Epoch 0's checkpoint is committed (SYNC) and its slow validation starts; then the
    first attempt fails on every rank. The next resumes after epoch 0 and reports epoch 1."""
    start = 0 if (ckpt := et.get_checkpoint()) is None else _epoch_of(ckpt) + 1
    for epoch in range(start, 2):
        checkpoint = _checkpoint_of(epoch)
        et.report({"epoch": epoch}, checkpoint=checkpoint,
                  checkpoint_upload_mode=et.CheckpointUploadMode.SYNC,
                  validation=checkpoint is not None)
        if start == 0:  # the first attempt (the next one resumes from epoch 0)
            assert wait_until(lambda: os.path.exists(config["log"]), 60)  # it runs now
            raise RuntimeError("the attempt fails while a validation runs")


def test_a_validation_cut_short_by_a_restart_runs_again_in_the_next_attempt(tmp_path):
    log = str(tmp_path / "validations")
    result = TorchTrainer(
        _fails_while_validating, train_loop_config={"log": log},
        scaling_config=et.ScalingConfig(num_workers=2),
        validation_config=et.ValidationConfig(_noted_validation, et.ValidationTaskConfig(
            fn_kwargs={"log": log, "sleep_s": 2.0})),
        run_config=et.RunConfig(name="restarted", storage_path=str(tmp_path / "results"),
                                failure_config=et.FailureConfig(max_failures=1))).fit()
    # epoch 0's first validation was killed with its attempt, then run again
    assert open(log).read().split("\n")[:-1] == [
        "start 0", "start 0", "end 0", "start 1", "end 1"]
    committed = RunStorage(result.filesystem, result.path).checkpoints.committed()
    assert [(m.metrics["val_epoch"], m.validation["status"]) for m in committed] == [
        (0, "VALIDATED"), (1, "VALIDATED")]
    assert list(result.metrics_dataframe["val_epoch"]) == [0, 1]
