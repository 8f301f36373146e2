"""One writer per run directory: a second job on a live run is refused before any process
starts; a job whose lease was taken over stops writing (fencing); a node that spent its
own budget leaves the uploads of a node that still runs alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from elastic_train.driver.run_lease import RunLease
from elastic_train.rendezvous_config import RendezvousConfig
from elastic_train.result import Result
from elastic_train.storage import RunStorage
from tests.conftest import child_pids, wait_until
from tests.support.nodes import node_drivers, node_log
from tests.support.paths import REPO
from tests.support.servers import stop_process

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240),
              pytest.mark.usefixtures("no_leaked_processes")]


def _marker(storage_path, name, index):
    return os.path.join(storage_path, name, f"checkpoint_{index:06d}", ".commit.json")


def _digest(out: str) -> str | None:
    return next((line.split()[1] for line in out.splitlines() if line.startswith("DIGEST")),
                None)


def _driver(storage_path, name, pid_dir, step_sleep, prefix=(), env=None):
    """``tests.e2e.scripts.driver`` (8 epochs, as ``start_driver``) with slower steps."""
    return subprocess.Popen(
        [*prefix, sys.executable, "-m", "tests.e2e.scripts.driver", storage_path, name,
         str(pid_dir), "8", str(step_sleep)], cwd=REPO, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)


def test_second_driver_on_a_live_run_is_refused_before_any_process_starts(
        storage_path, tmp_path, driver_digest):
    first_pids, second_pids = tmp_path / "first", tmp_path / "second"
    first_pids.mkdir()
    second_pids.mkdir()
    first = _driver(storage_path, "shared", first_pids, 0.5)
    try:
        assert wait_until(lambda: os.path.exists(_marker(storage_path, "shared", 1)), 150)
        second = _driver(storage_path, "shared", second_pids, 0.5)
        out2, _ = second.communicate(timeout=120)
        out1, _ = first.communicate(timeout=150)
    finally:
        stop_process(first)
    assert second.returncode != 0, out2
    assert not list(second_pids.glob("worker-*")), "the second driver started workers"
    assert "is in use by" in out2 and f"pid {first.pid}" in out2, out2
    assert "goes stale" in out2 and "takes the run over" in out2, out2
    assert first.returncode == 0, out1
    assert _digest(out1) == driver_digest  # the live run was not disturbed
    rows = Result.from_path(os.path.join(storage_path, "shared")).metrics_dataframe
    assert list(rows["training_iteration"]) == list(range(1, 9))


def _tree(pid: int) -> list[int]:
    """``pid`` and all its descendants, parents first."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop(0)
        out.append(current)
        todo += child_pids(current)
    return out


def _signal_tree(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


@pytest.fixture
def unshare_pid():
    """``unshare`` into a new pid namespace (as another host's processes look from
    here: their pids cannot be checked), or skip."""
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"unshare --pid is not available here: {probe.stderr.decode()[:200]}")
    return ["unshare", "--pid", "--fork", "--mount-proc"]


def test_a_hung_job_whose_stale_lease_was_taken_over_is_fenced(
        storage_path, tmp_path, driver_digest, unshare_pid):
    """The first driver runs in a pid namespace of its own (so its pid cannot be
    checked from here, as on another host) and is frozen with SIGSTOP until its lease
    is stale; a second driver takes the run over and trains it. When the first wakes
    up, its commits are refused (fencing), and it stops without touching the run."""
    env = {**os.environ, "ELASTIC_TRAIN_LEASE_TTL_S": "3"}
    first_pids, second_pids = tmp_path / "first", tmp_path / "second"
    first_pids.mkdir()
    second_pids.mkdir()
    first = _driver(storage_path, "hung", first_pids, 0.3, prefix=unshare_pid, env=env)
    second = None
    try:
        assert wait_until(lambda: os.path.exists(_marker(storage_path, "hung", 1)), 150)
        frozen = _tree(first.pid)
        _signal_tree(frozen, signal.SIGSTOP)
        time.sleep(4)  # past the lease's 3 s
        second = _driver(storage_path, "hung", second_pids, 0.3, env=env)
        assert wait_until(lambda: list(second_pids.glob("worker-*")), 120), "not taken over"
        _signal_tree(frozen, signal.SIGCONT)
        out1, _ = first.communicate(timeout=120)
        out2, _ = second.communicate(timeout=150)
    finally:
        for proc in (first, second):
            if proc is not None:
                _signal_tree(_tree(proc.pid), signal.SIGCONT)
                stop_process(proc)
    assert first.returncode != 0, out1
    assert "taken over" in out1, out1
    assert second.returncode == 0, out2
    assert _digest(out2) == driver_digest
    rows = Result.from_path(os.path.join(storage_path, "hung")).metrics_dataframe
    assert list(rows["training_iteration"]) == list(range(1, 9))


def test_node_that_spent_its_budget_leaves_uploads_of_a_live_node_alone(
        storage_path, tmp_path, etcd_endpoint):
    """A node of a 2-node job (etcd, no restarts) whose rank fails spends its budget and
    records the run as failed, while another node of the job still runs -- here this
    test's own process, holding that node's claim on the run's lease, as a node winding
    down or uploading does. Uploads that node may have in flight (one planted while the
    failed node's callback holds, as a commit of its rank could be) are not the failed
    node's to remove: only the job's last live node cleans up (the next start does it
    otherwise)."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    run_dir = os.path.join(storage_path, "budget")
    rendezvous = {"backend": "etcd", "endpoint": etcd_endpoint}
    settings = {"storage": storage_path, "name": "budget", "out_dir": str(out_dir),
                "epochs": 6, "rendezvous": rendezvous, "nodes": [1, 2], "max_failures": 0,
                "hold_after_exception": True,
                "fault": {"rank": 0, "epoch": 2, "batch": 0, "how": "raise",
                          "marker": str(tmp_path / "fault")}}
    in_flight = [os.path.join(run_dir, "checkpoint_000099", "shard.bin"),
                 os.path.join(run_dir, ".upload-marks", "checkpoint_000099.rank1")]
    other_node = RunLease.acquire(RunStorage.open(storage_path, "budget"),
                                  RendezvousConfig(run_id="budget", **rendezvous), "fit()")
    try:
        with node_drivers(settings, tmp_path, envs=[{}]) as procs:
            assert wait_until(lambda: (out_dir / "holding").exists(), 150), "no failure seen"
            for path in in_flight:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as f:
                    f.write("{}")
            (out_dir / "release").touch()
            code = procs[0].wait(120)
    finally:
        other_node.release()
    out = node_log(tmp_path, 0)
    assert code != 0 and "HOLD released" in out, out
    assert all(os.path.exists(path) for path in in_flight), "a live node's upload removed"


def test_a_node_joining_while_another_renews_the_lease_does_not_take_the_run_from_it(
        tmp_path, etcd_endpoint):
    """Two nodes of one job (``elastic-train launch``, etcd): the second acquires the run's
    lease over a slow store -- its pending claim stands for 2 s -- while the first, already
    holding it, renews it every 0.5 s. The first must not take that claim for a newer
    job's: it did (the pending claim carried the next token), stopped at the rendezvous
    without starting its worker, and the second waited for it at the end (bench figure 8a:
    8 agents started at once, 7 workers started)."""
    out, runs = tmp_path / "out", tmp_path / "runs"
    out.mkdir()
    worker = os.path.join(REPO, "tests", "e2e", "scripts", "rdzv_light_worker.py")
    args = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "etcd",
            "--rdzv-endpoint", etcd_endpoint, "--rdzv-id", "joining", "--name", "joining",
            "--storage-path", str(runs), "--no-python", sys.executable, worker, str(out), "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ELASTIC_TRAIN_LEASE_TTL_S": "2"}
    logs = [tmp_path / f"node{i}.log" for i in range(2)]
    procs: list[subprocess.Popen[bytes]] = []

    def start(module: list[str]) -> None:
        with open(logs[len(procs)], "wb") as f:
            procs.append(subprocess.Popen([sys.executable, "-m", *module, *args], cwd=REPO,
                                          env=env, stdout=f, stderr=subprocess.STDOUT))

    try:
        start(["elastic_train.cli", "launch"])
        assert wait_until(lambda: list(runs.glob(".leases/joining/claim-*")), 60), \
            logs[0].read_text()
        start(["tests.e2e.scripts.slow_lease_launch", "2"])
        deadline = time.monotonic() + 90
        codes = [_wait(proc, deadline) for proc in procs]
    finally:
        for proc in procs:
            stop_process(proc)
    texts = [log.read_text()[-2000:] for log in logs]
    assert codes == [0, 0], texts
    assert not any("taken over" in text for text in texts), texts
    starts = sorted(line.split()[:2] for line in (out / "starts").read_text().splitlines())
    assert starts == [["0", "2"], ["1", "2"]]


def _wait(proc: subprocess.Popen[bytes], deadline: float) -> int | None:
    """The process's exit code, or None if it still runs at ``deadline``."""
    try:
        return proc.wait(max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return None
