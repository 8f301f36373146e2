"""End-to-end: real workers under torch.distributed.elastic, 2 ranks, local storage."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import threading

import pytest

import elastic_train as et
from elastic_train.agent.zygote import server as zygote
from elastic_train.torch import TorchTrainer
from tests.conftest import (
    EPOCHS,
    fit,
    pid_alive,
    start_driver,
    stop_driver_after_commit,
    wait_until,
)
from tests.support import jobs, mistake_jobs

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180),
              pytest.mark.usefixtures("no_leaked_processes")]

def test_result_fields(storage):
    result = fit(storage, "fields")
    assert result.error is None
    assert result.metrics["training_iteration"] == EPOCHS
    assert result.metrics["epoch"] == EPOCHS - 1
    for key in ("timestamp", "time_total_s", "time_this_iter_s", "checkpoint_dir_name"):
        assert key in result.metrics
    assert result.checkpoint.path.endswith(f"checkpoint_{EPOCHS - 1:06d}")
    assert result.filesystem.exists(f"{result.checkpoint.path}/state.pt")
    with result.checkpoint.as_directory() as d:
        assert os.path.getsize(os.path.join(d, "state.pt")) > 0
    assert len(result.best_checkpoints) == EPOCHS
    assert result.return_value["world_size"] == 2
    assert len(result.return_value["digest"]) == 64
    df = result.metrics_dataframe
    assert list(df["training_iteration"]) == list(range(1, EPOCHS + 1))
    again = et.Result.from_path(result.path, storage_filesystem=result.filesystem)
    assert again.metrics == result.metrics
    assert again.checkpoint == result.checkpoint
    state = storage.run("fields").read_run_state().to_json()
    assert state["status"] == "finished"
    assert state["versions"]["torch"]


@pytest.mark.parametrize("order,expected", [("max", {1, 3}), ("min", {0, 2})])
def test_top_k_retention_keeps_best_and_latest(storage, order, expected):
    scores = {"0": 1.0, "1": 5.0, "2": 2.0, "3": 4.0, "4": 3.0}
    result = fit(storage, f"topk-{order}", config={"scores": scores},
                 checkpoint_config=et.CheckpointConfig(
                     num_to_keep=2, checkpoint_score_attribute="score",
                     checkpoint_score_order=order))
    best = {int(c.path.rsplit("_", 1)[1]) for c, _ in result.best_checkpoints}
    assert best == expected  # as Ray's: the latest is kept on disk, not listed among the best
    assert result.checkpoint.path.endswith(f"checkpoint_{EPOCHS - 1:06d}")
    result.filesystem.invalidate_cache()
    on_disk = sorted(p.rsplit("/", 1)[1] for p in result.filesystem.ls(result.path, detail=False)
                     if p.rsplit("/", 1)[1].startswith("checkpoint_"))
    assert on_disk == [f"checkpoint_{i:06d}" for i in sorted(expected | {EPOCHS - 1})]


@pytest.mark.parametrize("how,mode", [("raise", "SYNC"), ("exit", "SYNC"), ("sigkill", "SYNC"),
                                      ("sigkill", "ASYNC")])
def test_worker_failure_resumes_bit_identical(storage, tmp_path, baseline, how, mode):
    starts = tmp_path / "starts"
    fault = {"rank": 1, "epoch": 2, "batch": 1, "how": how, "marker": str(tmp_path / "m")}
    result = fit(storage, f"fail-{how}", max_failures=1,
                 config={"fault": fault, "starts_file": str(starts), "upload_mode": mode})
    # SYNC: resumed right after the checkpoint of epoch 1. ASYNC: that checkpoint may
    # still have been uploading when the worker died; then it resumes one epoch earlier.
    expected = [["0", "2"]] if mode == "SYNC" else [["0", "2"], ["0", "1"]]
    assert starts.read_text().split() in expected
    assert result.return_value["digest"] == baseline.return_value["digest"]
    iterations = list(result.metrics_dataframe["training_iteration"])
    assert iterations == list(range(1, EPOCHS + 1))
    failures = storage.run(f"fail-{how}").read_run_state().to_json()["failures"]
    assert len(failures) == 1 and failures[0]["workers"][0]["rank"] == 1


def test_a_single_file_written_by_a_writer_process_resumes_bit_identical(storage_path,
                                                                        tmp_path, baseline):
    """elastic_train.torch.async_save(state, "state.pt") on rank 0: a writer process
    writes the file, report() commits it once written; rank 1's SIGKILL resumes from
    the latest committed one, bit-identical."""
    starts = tmp_path / "starts"
    fault = {"rank": 1, "epoch": 2, "batch": 1, "how": "sigkill", "marker": str(tmp_path / "m")}
    result = fit(storage_path, "async-file", max_failures=1,
                 config={"fault": fault, "starts_file": str(starts), "process_save": True})
    assert starts.read_text().split() in [["0", "2"], ["0", "1"]]  # as ASYNC uploads
    assert result.return_value["digest"] == baseline.return_value["digest"]
    assert sorted(result.checkpoint.get_commit_info().files) == ["state.pt"]


def test_killed_zygote_is_replaced_at_the_restart(storage_path, tmp_path, baseline):
    """The process workers are forked from dies: its workers die with it, the agent
    restarts the group from a new zygote, and the run resumes bit-identical."""
    starts = tmp_path / "starts"
    fault = {"rank": 0, "epoch": 2, "batch": 1, "how": "kill_zygote",
             "marker": str(tmp_path / "m")}
    before = zygote.running_pid()
    result = fit(storage_path, "zygote-killed", max_failures=1,
                 config={"fault": fault, "starts_file": str(starts), "upload_mode": "SYNC"})
    assert starts.read_text().split() == ["0", "2"]
    assert result.return_value["digest"] == baseline.return_value["digest"]
    assert zygote.running_pid() not in (None, before)
    with open(os.path.join(result.path, "run.json")) as f:
        workers = json.load(f)["failures"][0]["workers"]
    assert any("worker zygote" in w["message"] and "died" in w["message"] for w in workers)


@pytest.mark.compat
def test_worker_sigkilled_from_outside_mid_epoch(storage_path, tmp_path, baseline):
    pid_file = tmp_path / "pid"
    starts = tmp_path / "starts"
    fault = {"rank": 0, "epoch": 3, "batch": 2, "how": "wait_for_kill",
             "marker": str(tmp_path / "m"), "pid_file": str(pid_file)}

    def killer():
        if wait_until(lambda: pid_file.exists() and pid_file.read_text(), 120):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    result = fit(storage_path, "sigkill-outside", max_failures=2,
                 config={"fault": fault, "starts_file": str(starts), "upload_mode": "SYNC"})
    thread.join(5)
    assert starts.read_text().split() == ["0", "3"]
    assert result.return_value["digest"] == baseline.return_value["digest"]
    with open(os.path.join(result.path, "run.json")) as f:
        failure = json.load(f)["failures"][0]["workers"][0]
    assert failure["rank"] == 0 and failure["signal"] == "SIGKILL"


@pytest.mark.compat  # also on the older cloudpickle (.ci/run's COMPAT_PINS)
def test_budget_exhausted_raises_with_rank_and_traceback(storage_path, tmp_path):
    fault = {"rank": 1, "epoch": 1, "how": "raise", "marker": str(tmp_path / "m")}
    with pytest.raises(et.TrainingFailedError) as info:
        fit(storage_path, "exhausted", config={"fault": fault})
    message = str(info.value)
    assert "rank 1" in message and "exited with code 1" in message
    assert "RuntimeError: injected failure at epoch 1" in message
    assert "jobs.py" in message  # the worker's own traceback
    assert "FailureConfig(max_failures=N)" in message
    assert info.value.failures[0].rank == 1
    result = et.Result.from_path(os.path.join(storage_path, "exhausted"))
    assert isinstance(result.error, et.TrainingFailedError)
    assert result.checkpoint.path.endswith("checkpoint_000000")


def test_a_checkpoint_in_flight_when_the_run_fails_is_kept(storage_path):
    """The last checkpoint a run reported is stored although a rank failed while it was
    still uploading and no restart was left (it was dropped, as if rank 0 had died)."""
    trainer = TorchTrainer(
        jobs.report_then_a_peer_fails, train_loop_config={"write_s": 2.0},
        scaling_config=et.ScalingConfig(num_workers=2),
        run_config=et.RunConfig(storage_path=storage_path, name="in-flight"))
    with pytest.raises(et.TrainingFailedError, match="rank 1 fails right after the report"):
        trainer.fit()
    result = et.Result.from_path(os.path.join(storage_path, "in-flight"))
    assert result.checkpoint is not None, "the reported checkpoint was lost"
    with result.checkpoint.as_directory() as d, open(os.path.join(d, "state.txt")) as f:
        assert f.read() == "reported before rank 1 failed"


def test_a_checkpoint_in_flight_when_a_rank_raises_is_restored_by_the_restart(storage_path):
    """Under our ASYNC default, the checkpoint reported right before an error is what the
    in-process restart resumes from: every worker lives, so the uploads reported before
    the error are finished and committed before the next attempt (they were dropped,
    as if a process had died, and the run restarted from scratch; Ray's guide that
    raises on purpose then resumed at the wrong epoch)."""
    result = TorchTrainer(
        jobs.report_then_fail_once, train_loop_config={"write_s": 1.0},
        scaling_config=et.ScalingConfig(num_workers=2),
        run_config=et.RunConfig(storage_path=storage_path, name="finished-on-restart",
                                failure_config=et.FailureConfig(max_failures=1))).fit()
    assert result.return_value == "reported before rank 1 failed"


def _crash_every_attempt(config):
    """Fails the first ``crashes`` attempts right after a collective, alternating ranks."""
    import torch
    import torch.distributed as dist

    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    if attempt < config["crashes"] and dist.get_rank() == attempt % 2:
        os._exit(3)
    dist.all_reduce(tensor)
    et.report({"attempt": attempt, "sum": tensor.item()})
    return attempt


def test_repeated_restarts_always_reconnect(storage_path):
    """Plain torchrun's gloo restarts fail intermittently on stale store keys; ours must not.
    (The crashes come before any report: the no-progress guard is off for this test.)"""
    crashes = 6
    result = TorchTrainer(
        _crash_every_attempt, train_loop_config={"crashes": crashes},
        scaling_config=et.ScalingConfig(num_workers=2),
        run_config=et.RunConfig(storage_path=storage_path, name="restarts",
                                failure_config=et.FailureConfig(
                                    max_failures=-1, max_restarts_without_progress=-1)),
    ).fit()
    assert result.return_value == crashes
    assert result.metrics["sum"] == 4.0


def test_missing_score_attribute_is_named(storage_path):
    with pytest.raises(et.TrainingFailedError, match="checkpoint_score_attribute='accuracy'"):
        fit(storage_path, "no-score", checkpoint_config=et.CheckpointConfig(
            checkpoint_score_attribute="accuracy"))


def _only_rank_1_checkpoints(config: dict) -> None:
    import tempfile

    import torch.distributed as dist

    checkpoint = None
    if dist.get_rank() == 1:
        directory = tempfile.mkdtemp()
        with open(os.path.join(directory, "shard.pt"), "wb") as f:
            f.write(b"rank 1's shard")
        checkpoint = et.Checkpoint.from_directory(directory)
    et.report({"loss": 1.0}, checkpoint=checkpoint)


def test_missing_score_attribute_is_named_when_only_another_rank_checkpoints(storage_path):
    """Rank 0's metrics are the row: its score is checked whichever rank holds the files."""
    with pytest.raises(et.TrainingFailedError, match="checkpoint_score_attribute='accuracy'"):
        TorchTrainer(_only_rank_1_checkpoints, scaling_config=et.ScalingConfig(num_workers=2),
                     run_config=et.RunConfig(
                         storage_path=storage_path, name="no-score-rank-1",
                         checkpoint_config=et.CheckpointConfig(
                             checkpoint_score_attribute="accuracy"))).fit()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_driver_stopped_leaves_no_orphans_and_resumes(storage_path, tmp_path, sig,
                                                      driver_digest):
    """Ray Train v2's contract: running the same script again continues the run."""
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    driver = start_driver(storage_path, "driver-stop", pid_dir)
    run_dir = os.path.join(storage_path, "driver-stop")
    workers = stop_driver_after_commit(driver, run_dir, 1, sig, pid_dir)
    assert len(workers) == 2
    assert driver.returncode != 0
    assert wait_until(lambda: not any(pid_alive(p) for p in workers), 30), "orphaned workers"
    with open(os.path.join(run_dir, "run.json")) as f:
        status = json.load(f)["status"]
    assert status == ("interrupted" if sig == signal.SIGINT else "running")
    assert TorchTrainer.can_restore(run_dir)

    resumed = start_driver(storage_path, "driver-stop", pid_dir)
    out, _ = resumed.communicate(timeout=150)
    assert resumed.returncode == 0, out
    assert f"DIGEST {driver_digest}" in out
    starts = (pid_dir / "starts").read_text().split()
    assert starts[0] == "0" and int(starts[-1]) >= 2
    rows = et.Result.from_path(run_dir).metrics_dataframe
    assert list(rows["training_iteration"]) == list(range(1, 9))


def test_worker_deadlocked_in_all_reduce_is_restarted(storage_path, tmp_path, baseline):
    """Rank 1 never joins a collective: rank 0 blocks in all_reduce. Both stop making
    progress; the agent dumps their stacks, stops them and restarts within the timeout."""
    fault = {"rank": 1, "epoch": 2, "batch": 1, "how": "deadlock", "marker": str(tmp_path / "m")}
    starts = tmp_path / "starts"
    result = TorchTrainer(
        jobs.train_mlp,
        train_loop_config={"epochs": EPOCHS, "fault": fault, "starts_file": str(starts),
                           "upload_mode": "SYNC"},
        scaling_config=et.ScalingConfig(num_workers=2),
        run_config=et.RunConfig(storage_path=storage_path, name="hang",
                                failure_config=et.FailureConfig(max_failures=1,
                                                                hang_timeout_s=4)),
        datasets={"train": jobs.make_dataset()},
    ).fit()
    assert starts.read_text().split() == ["0", "2"]
    assert result.return_value["digest"] == baseline.return_value["digest"]
    with open(os.path.join(result.path, "run.json")) as f:
        workers = json.load(f)["failures"][0]["workers"]
    hung = {w["rank"]: w for w in workers}
    assert "HangError: rank 1 made no progress" in hung[1]["message"]
    assert "jobs.py" in hung[1]["traceback"]  # its Python stack, taken before the kill


@pytest.mark.timeout(60)
def test_a_one_node_job_trains_on_a_host_whose_own_name_does_not_resolve(storage_path,
                                                                          monkeypatch):
    """One node's rendezvous store and its workers' MASTER_ADDR are on loopback (as
    torchrun's --standalone), not the host's name: a host whose name does not resolve
    trains instead of sitting at "starting" with c10d's getaddrinfo warnings."""
    monkeypatch.setattr(socket, "getfqdn", lambda name="": "no-such-host.invalid")
    monkeypatch.setattr(socket, "gethostname", lambda: "no-such-host.invalid")
    result = TorchTrainer(
        mistake_jobs.report_nan_loss, scaling_config=et.ScalingConfig(num_workers=2),
        run_config=et.RunConfig(storage_path=storage_path, name="unresolvable",
                                storage_retry_timeout_s=5)).fit()
    assert result.error is None and result.metrics["loss"] == -math.inf
