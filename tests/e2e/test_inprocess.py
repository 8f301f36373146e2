"""In-process restarts with real workers: the surviving processes run the train function
again; only a dead, wedged or unhealthy rank gets a new (warm) process; nothing of a
failed attempt is left behind; restarts that bring no progress stop the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import pytest
import torch

import elastic_train as et
from elastic_train.torch import TorchTrainer
from tests.conftest import EPOCHS
from tests.support import jobs, restart_job
from tests.support.launched import SCRIPT, launch, run_nodes, starts, worker_pids
from tests.support.paths import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240),
              pytest.mark.usefixtures("no_leaked_processes")]

CLI = [sys.executable, "-m", "elastic_train.cli"]


def run_json(path: str) -> dict:
    with open(os.path.join(path, "run.json")) as f:
        return json.load(f)


def pids_by_rank(path) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for line in path.read_text().split("\n"):
        if line:
            rank, pid = map(int, line.split())
            if pid not in out.setdefault(rank, []):
                out[rank].append(pid)
    return out


def fit_mlp(storage_path, name, tmp_path, faults, unwind_timeout_s=10.0):
    return TorchTrainer(
        jobs.train_mlp,
        train_loop_config={"epochs": EPOCHS, "faults": faults,
                           "pids_file": str(tmp_path / "pids"),
                           "starts_file": str(tmp_path / "starts")},
        scaling_config=et.ScalingConfig(num_workers=2),
        run_config=et.RunConfig(storage_path=storage_path, name=name,
                                failure_config=et.FailureConfig(
                                    max_failures=2, unwind_timeout_s=unwind_timeout_s)),
        datasets={"train": jobs.make_dataset()},
    ).fit()


def fault(tmp_path, rank, how, epoch=2, batch=1):
    return {"rank": rank, "epoch": epoch, "batch": batch, "how": how,
            "marker": str(tmp_path / f"marker-{rank}-{how}")}


@pytest.mark.compat
def test_exception_restarts_the_same_processes(storage_path, tmp_path, baseline):
    result = fit_mlp(storage_path, "raise", tmp_path, [fault(tmp_path, 1, "raise")])
    assert result.return_value["digest"] == baseline.return_value["digest"]
    pids = pids_by_rank(tmp_path / "pids")
    assert sorted(pids) == [0, 1] and all(len(p) == 1 for p in pids.values())  # no new process
    assert (tmp_path / "starts").read_text().split() == ["0", "2"]
    [failure] = run_json(result.path)["failures"]
    assert failure["restart"] == "in-process" and "replaced" not in failure
    assert "RuntimeError: injected failure at epoch 2" in failure["workers"][0]["message"]
    assert failure["workers"][0]["rank"] == 1  # the root cause, not the peer it broke


def test_sigkill_replaces_only_the_dead_rank(storage_path, tmp_path, baseline):
    result = fit_mlp(storage_path, "sigkill", tmp_path, [fault(tmp_path, 1, "sigkill")])
    assert result.return_value["digest"] == baseline.return_value["digest"]
    pids = pids_by_rank(tmp_path / "pids")
    assert len(pids[0]) == 1 and len(pids[1]) == 2  # rank 0 survived, rank 1 is new
    [failure] = run_json(result.path)["failures"]
    assert failure["restart"] == "in-process"
    assert failure["replaced"] == {"1": "its process ended"}
    assert failure["workers"][0]["signal"] == "SIGKILL"


def test_a_rank_whose_device_is_left_unhealthy_is_replaced(storage_path, tmp_path, baseline):
    """docs/fault-tolerance.md's table: a CUDA error that sticks to the context cannot be
    repaired in place; the rank's check after the failure says so, and only that rank
    gets a new process."""
    result = fit_mlp(storage_path, "sticky", tmp_path, [fault(tmp_path, 0, "sticky_device")])
    assert result.return_value["digest"] == baseline.return_value["digest"]
    pids = pids_by_rank(tmp_path / "pids")
    assert len(pids[0]) == 2 and len(pids[1]) == 1
    [failure] = run_json(result.path)["failures"]
    assert failure["replaced"] == {"0": "its device was unhealthy"}
    assert "injected CUDA error at epoch 2" in failure["workers"][0]["message"]


def test_wedged_survivor_is_killed_and_replaced(storage_path, tmp_path, baseline):
    """Rank 0 is stuck in a C call that holds the GIL when rank 1 fails: it cannot unwind,
    so after the unwind timeout it is killed and a new process takes its place."""
    started = time.monotonic()
    result = fit_mlp(storage_path, "wedge", tmp_path,
                     [fault(tmp_path, 0, "wedge"), fault(tmp_path, 1, "raise")],
                     unwind_timeout_s=2.0)
    assert result.return_value["digest"] == baseline.return_value["digest"]
    pids = pids_by_rank(tmp_path / "pids")
    assert len(pids[0]) == 2 and len(pids[1]) == 1
    [failure] = run_json(result.path)["failures"]
    assert failure["replaced"] == {"0": "it did not leave the failed attempt within 2s"}
    assert time.monotonic() - started < 120


def _fit_restart_job(storage_path, name, config):
    return TorchTrainer(
        restart_job.train_with_faults, train_loop_config=config,
        scaling_config=et.ScalingConfig(num_workers=2),
        run_config=et.RunConfig(storage_path=storage_path, name=name,
                                failure_config=et.FailureConfig(max_failures=-1)),
    ).fit()


def test_nothing_of_a_failed_attempt_is_left_behind(storage_path, tmp_path):
    """DataLoader worker processes, threads and descriptors of failed attempts are gone when
    the next attempt starts, after exceptions and after a peer's SIGKILL alike."""
    config = {"epochs": 2, "num_workers": 2, "fail_after": 5, "checkpoint_every": 4,
              "probe_file": str(tmp_path / "probe")}
    straight = _fit_restart_job(storage_path, "straight", dict(config, probe_file=None))
    faulty = _fit_restart_job(storage_path, "faulty", dict(
        config, faults={"0": "raise", "1": "sigkill", "2": "raise", "3": "exit"}))
    for key, value in straight.return_value["weights"].items():
        assert torch.equal(value, faulty.return_value["weights"][key]), key
    probes = [json.loads(line) for line in (tmp_path / "probe").read_text().splitlines()]
    assert [p["attempt"] for p in probes] == [0, 1, 2, 3, 4]
    assert len({p["pid"] for p in probes}) == 1  # rank 0 survived every failure
    second, *later = probes[1:]
    for probe in later:
        for what in ("fds", "threads", "children"):
            assert probe[what] == second[what], (what, probes)
    assert second["children"] == 0  # the DataLoader's workers of failed attempts are gone
    failures = run_json(faulty.path)["failures"]
    assert [f["restart"] for f in failures] == ["in-process"] * 4


def _fail_every_attempt_after_progress(config):
    """Reports two checkpoints, then fails at the third step -- in every attempt."""
    start = 0
    if (checkpoint := et.get_checkpoint()) is not None:
        with checkpoint.as_directory() as d:
            with open(os.path.join(d, "step")) as f:
                start = int(f.read())
    for step in range(start, 10):
        if step == 2 and et.get_context().get_world_rank() == 1:
            raise ValueError("loss is nan")
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "step"), "w") as f:
                f.write(str(step + 1))
            et.report({"step": step}, checkpoint=et.Checkpoint.from_directory(d),
                      checkpoint_upload_mode="SYNC")


def test_no_progress_guard_stops_an_unlimited_budget(storage_path):
    with pytest.raises(et.NoProgressError) as info:
        TorchTrainer(_fail_every_attempt_after_progress,
                     scaling_config=et.ScalingConfig(num_workers=2),
                     run_config=et.RunConfig(storage_path=storage_path, name="stuck",
                                             failure_config=et.FailureConfig(max_failures=-1)),
                     ).fit()
    reason = info.value.reason
    assert "no progress in 3 consecutive restarts" in reason
    assert "each failed with rank 1: ValueError: loss is nan" in reason
    assert info.value.exit_code == 3
    assert "set FailureConfig(max_restarts_without_progress=-1)" in str(info.value)
    state = run_json(os.path.join(storage_path, "stuck"))
    assert state["status"] == "failed" and state["no_progress"] == reason
    assert len(state["failures"]) == 4  # the first attempt made progress, 3 restarts did not
    show = subprocess.run([*CLI, "show", os.path.join(storage_path, "stuck")], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert f"stopped:  {reason} (exit code 3)" in show.stdout


def _launch_and_wait(*args, timeout=150):
    proc = launch(*args)
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


@pytest.mark.parametrize("how,processes", [pytest.param("raise", 2, marks=pytest.mark.compat),
                                           ("exit", 3)])
def test_launch_wrapper_restarts_in_process(storage_path, tmp_path, how, processes):
    straight_dir, faulty_dir = tmp_path / "straight", tmp_path / "faulty"
    straight_dir.mkdir()
    faulty_dir.mkdir()
    code, straight = _launch_and_wait("--nproc-per-node", 2, "--storage-path", storage_path,
                                      "--name", "straight", SCRIPT, straight_dir, 5)
    assert code == 0, straight
    code, out = _launch_and_wait("--nproc-per-node", 2, "--max-restarts", 1, "--storage-path",
                                 storage_path, "--name", "wrapped", SCRIPT, faulty_dir, 5,
                                 "--crash-at", 2, "--crash-how", how, "--restartable")
    assert code == 0, out
    digest = [line for line in straight.splitlines() if "DIGEST" in line]
    assert digest and digest[0].split("DIGEST")[1] in out
    assert starts(faulty_dir) == [(0, 2), (2, 2)]
    assert len(worker_pids(faulty_dir)) == processes  # a new process only for a dead rank
    [failure] = run_json(os.path.join(storage_path, "wrapped"))["failures"]
    assert failure["restart"] == "in-process"


def test_launch_wrapper_restarts_a_failure_before_any_session_joined(storage_path, tmp_path):
    """A rank fails after get_context() and before get_checkpoint(), so no session of the
    attempt joined (the survivor's join breaks on the dead peer): the attempt is let go
    and the same processes start again."""
    code, out = _launch_and_wait("--nproc-per-node", 2, "--max-restarts", 1, "--storage-path",
                                 storage_path, "--name", "early", SCRIPT, tmp_path, 3,
                                 "--crash-before-checkpoint", "--restartable")
    assert code == 0, out
    assert starts(tmp_path) == [(0, 2)]
    [failure] = run_json(os.path.join(storage_path, "early"))["failures"]
    assert failure["restart"] == "in-process" and not failure.get("replaced"), failure


def test_launch_without_wrapper_keeps_torchrun_restarts(storage_path, tmp_path):
    code, out = _launch_and_wait("--nproc-per-node", 2, "--max-restarts", 1, "--storage-path",
                                 storage_path, "--name", "plain", SCRIPT, tmp_path, 4,
                                 "--crash-at", 1)
    assert code == 0, out
    assert len(worker_pids(tmp_path)) == 4  # both ranks started again
    [failure] = run_json(os.path.join(storage_path, "plain"))["failures"]
    assert failure["restart"] == "new processes"


def test_launch_no_progress_exits_3(storage_path, tmp_path):
    code, out = _launch_and_wait("--nproc-per-node", 2, "--max-restarts", -1, "--storage-path",
                                 storage_path, "--name", "stuck", SCRIPT, tmp_path, 5,
                                 "--crash-at", 2, "--crash-always", "--restartable")
    assert code == 3, out
    assert "Training stopped: no progress in 3 consecutive restarts" in out
    assert "rank 1: RuntimeError: crash at epoch 2" in out
    assert "To turn this guard off, pass --max-restarts-without-progress -1." in out


def test_verify_resume_passes_with_in_process_restarts(tmp_path):
    """The injected crash kills the last rank; the other restarts in its own process."""
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run(
        [*CLI, "verify-resume", "--workdir", str(tmp_path / "runs"), "--fail-at-report", "2",
         "tests/e2e/scripts/launch_script.py", str(out), "5", "--restartable"],
        cwd=REPO, capture_output=True, text=True, timeout=220)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK: after a crash at report 2" in proc.stdout
    runs = tmp_path / "runs"
    state = next(json.loads(p.read_text()) for p in runs.rglob("run.json")
                 if json.loads(p.read_text())["failures"])
    assert state["failures"][0]["restart"] == "in-process"


@pytest.mark.timeout(300)
def test_failure_on_one_node_restarts_no_process_on_the_others(storage_path, tmp_path):
    """Three agents, one worker each: a worker that raises on one node makes every rank
    run the train function again, and no process anywhere is started again."""
    codes = run_nodes(tmp_path, 3, "--rdzv-id", "three", "--max-restarts", 1,
                      "--storage-path", storage_path, SCRIPT, tmp_path, 5, "--crash-at", 2,
                      "--sleep", 0.2, "--restartable", timeout=200)
    assert codes == [0, 0, 0], [(tmp_path / f"node{i}.log").read_text()[-2000:]
                                for i in range(3)]
    assert starts(tmp_path) == [(0, 3), (2, 3)]
    assert len(worker_pids(tmp_path)) == 3  # the same three processes throughout
    failures = run_json(os.path.join(storage_path, "three"))["failures"]
    assert [f["restart"] for f in failures] == ["in-process"]
