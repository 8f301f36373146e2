"""SIGTERM to every process of a node at once (Slurm's scancel and preemption, systemd's
stop): the same outcome as a SIGTERM to the driver alone -- a notice, a just-in-time
checkpoint committed within the grace period, the workers stopped when it ends, and
for the job's other nodes a restart charged to the preemption budget."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import elastic_train as et
from elastic_train._internal import env_vars
from tests.conftest import pid_alive, wait_until
from tests.support.paths import REPO
from tests.support.process_tree import descendants, signal_tree, stop_logged, stop_tree
from tests.support.servers import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240),
              pytest.mark.usefixtures("no_leaked_processes")]

GRACE_S = 6.0


def _driver(storage_path: str, name: str, pid_dir, zygote_on: bool, *grace: str):
    env = {**os.environ, env_vars.ZYGOTE: "1" if zygote_on else "0"}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.scripts.driver", storage_path, name, str(pid_dir),
         "8", "0.3", *grace], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)


def _term_whole_tree_after_commit(driver, run_dir: str) -> tuple[float, list[int]]:
    """Once checkpoint 0 is committed, SIGTERM to the driver and every process below it;
    returns the seconds until the driver ended and the pids signalled."""
    marker = os.path.join(run_dir, "checkpoint_000000", ".commit.json")
    try:
        assert wait_until(lambda: os.path.exists(marker), 150), "no checkpoint committed"
        assert wait_until(lambda: len(descendants(driver.pid)) >= 2, 30)  # workers running
        sent = time.monotonic()
        pids = signal_tree(driver.pid, signal.SIGTERM)
        driver.wait(GRACE_S + 60)
        return time.monotonic() - sent, pids
    finally:
        if driver.poll() is None:
            stop_tree(driver.pid)
            driver.wait()


@pytest.mark.parametrize("zygote_on", [True, False], ids=["zygote", "no-zygote"])
def test_sigterm_to_every_process_gives_a_committed_jit_checkpoint(
        storage_path, tmp_path, zygote_on, driver_digest):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    driver = _driver(storage_path, "node-term", pid_dir, zygote_on, str(GRACE_S))
    took, signalled = _term_whole_tree_after_commit(driver, os.path.join(storage_path,
                                                                         "node-term"))
    out = driver.stdout.read()
    assert driver.returncode != 0, out
    assert wait_until(lambda: not any(pid_alive(p) for p in signalled), 30), "orphans"
    # The grace was respected: the workers trained on until it ended, then were stopped.
    assert GRACE_S - 1 <= took <= GRACE_S + 30, (took, out[-3000:])
    assert (pid_dir / "jit").exists(), f"no just-in-time checkpoint: {out[-3000:]}"
    run_dir = os.path.join(storage_path, "node-term")
    with open(os.path.join(run_dir, "run.json")) as f:
        assert json.load(f)["status"] == "interrupted"
    rows = et.Result.from_path(run_dir).metrics_dataframe
    jit = rows[rows["jit"] == 1]
    assert len(jit) == 1
    assert os.path.exists(os.path.join(run_dir, jit["checkpoint_dir_name"].iloc[0],
                                       ".commit.json"))

    resumed = _driver(storage_path, "node-term", pid_dir, zygote_on)
    out, _ = resumed.communicate(timeout=150)
    assert resumed.returncode == 0, out
    assert int((pid_dir / "starts").read_text().split()[-1]) >= int(
        (pid_dir / "jit").read_text().split()[0])
    assert f"DIGEST {driver_digest}" in out


def _launch(tmp_path, index: int, endpoint: str, storage_path: str, out_dir):
    log = open(tmp_path / f"agent{index}.log", "w")  # noqa: SIM115 (closed by the caller)
    proc = subprocess.Popen(
        [sys.executable, "-m", "elastic_train.cli", "launch", "--nnodes", "1:2",
         "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
         "--rdzv-id", "node-term",
         "--max-restarts", "0", "--preemption-grace", "3", "--storage-path", storage_path,
         "tests/e2e/scripts/launch_script.py", str(out_dir), "10", "--sleep", "1"],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True)
    return proc, log


def test_sigterm_to_a_whole_node_is_a_preemption_for_the_others(storage_path, tmp_path):
    """Two nodes; every process of the second gets SIGTERM. The first learns of the notice
    at the next report, the second's workers go after the grace, and the first restarts
    alone, spending the preemption budget (max_restarts is 0), and finishes."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    endpoint = f"127.0.0.1:{free_port()}"
    agents = []
    try:
        agents.append(_launch(tmp_path, 0, endpoint, storage_path, out_dir))
        time.sleep(2)  # the first agent hosts the c10d store and is group rank 0
        agents.append(_launch(tmp_path, 1, endpoint, storage_path, out_dir))
        # Both nodes in the job (a node still starting up when the signal comes is not
        # what this test is about), and a checkpoint committed by the 2-node job.
        starts = out_dir / "starts"
        assert wait_until(lambda: starts.exists() and any(
            line.split()[1] == "2" for line in starts.read_text().splitlines()), 150), \
            "the second node never joined"
        run_dir = os.path.join(storage_path, "node-term")
        before = set(glob.glob(os.path.join(run_dir, "checkpoint_*", ".commit.json")))
        assert wait_until(lambda: set(glob.glob(os.path.join(
            run_dir, "checkpoint_*", ".commit.json"))) - before, 150), "no checkpoint committed"
        victim = agents[1][0]
        signal_tree(victim.pid, signal.SIGTERM)
        code = victim.wait(60)
        agents[1][1].flush()
        assert code == 128 + signal.SIGTERM, (  # once seen: -6 (SIGABRT), cause unknown
            code, (tmp_path / "agent1.log").read_text()[-6000:])
        assert agents[0][0].wait(150) == 0, (tmp_path / "agent0.log").read_text()[-3000:]
    finally:
        stop_logged(agents)
    with open(os.path.join(storage_path, "node-term", "run.json")) as f:
        state = json.load(f)
    assert state["status"] == "finished"
    assert [f["kind"] for f in state["failures"]] == ["preemption"], state["failures"]
