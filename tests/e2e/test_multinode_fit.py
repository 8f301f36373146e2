"""The Python API across nodes: the same driver script (``TorchTrainer.fit()``) run on
several nodes forms one job -- here two driver processes on this machine, each one a
node of one worker, with c10d and with etcd v3 rendezvous."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import wait_until
from tests.support.etcd_server import run_keys
from tests.support.paths import REPO
from tests.support.servers import free_port, stop_process

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240),
              pytest.mark.usefixtures("no_leaked_processes")]



def _driver(storage_path, name, out_dir, backend, endpoint, nodes, epochs, log):
    low, high = nodes
    return subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.scripts.multinode_driver", storage_path, name,
         str(out_dir), backend, endpoint, str(low), str(high), str(epochs)],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True)


def _lines(path):
    return path.read_text().split() if path.exists() else []


def _attempts(out_dir):
    """(start epoch, world size) of each attempt, as rank 0 wrote them."""
    return list(zip(map(int, _lines(out_dir / "starts")), map(int, _lines(out_dir / "worlds")),
                    strict=False))


def _run_json(storage_path, name):
    with open(os.path.join(storage_path, name, "run.json")) as f:
        return json.load(f)


def _results(tmp_path):
    return [line.split(maxsplit=2)[2] for i in (0, 1)
            for line in (tmp_path / f"node{i}.log").read_text().splitlines()
            if line.startswith("RESULT")]


def _start_two(tmp_path, storage_path, name, backend, endpoint, nodes, epochs):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    logs = [open(tmp_path / f"node{i}.log", "w") for i in (0, 1)]  # noqa: SIM115
    procs = []
    for i, log in enumerate(logs):
        procs.append(_driver(storage_path, name, out_dir, backend, endpoint, nodes, epochs,
                             log))
        if i == 0 and backend == "c10d":
            time.sleep(2)  # the first node binds the endpoint and hosts the c10d store
    return out_dir, procs, logs


def _stop(procs, logs):
    for proc in procs:
        stop_process(proc)
    for log in logs:
        log.close()


def test_two_drivers_form_one_job(storage_path, tmp_path):
    """c10d here; etcd forms the job in the next test (and in test_e2e_launch)."""
    backend, endpoint = "c10d", f"127.0.0.1:{free_port()}"
    name, epochs = "fit2", 4
    out_dir, procs, logs = _start_two(tmp_path, storage_path, name, backend, endpoint,
                                      (2, 2), epochs)
    try:
        codes = [proc.wait(180) for proc in procs]
    finally:
        _stop(procs, logs)
    assert codes == [0, 0], [(tmp_path / f"node{i}.log").read_text()[-3000:] for i in (0, 1)]
    assert _attempts(out_dir) == [(0, 2)]  # one job, world size 2
    # Both nodes return the same result; the return value is on rank 0's node only.
    results = sorted(_results(tmp_path))
    assert results == [f"iteration={epochs} checkpoint=checkpoint_{epochs - 1:06d} world=2",
                       f"iteration={epochs} checkpoint=checkpoint_{epochs - 1:06d} world=None"]
    state = _run_json(storage_path, name)  # written by one node only
    assert state["status"] == "finished" and len(state["launches"]) == 1
    run_dir = os.path.join(storage_path, name)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert [r["training_iteration"] for r in rows] == list(range(1, epochs + 1))  # once each
    # one worker a node: the slowest rank's node is its node's group rank, sent with its time
    assert all(r["slowest_node"] == r["slowest_rank"] for r in rows), rows
    assert sorted(p for p in os.listdir(run_dir) if p.startswith("checkpoint_")) == \
        [f"checkpoint_{i:06d}" for i in range(epochs)]


@pytest.mark.timeout(300)
def test_killed_driver_leaves_the_other_training_at_the_smaller_size(
        etcd_endpoint, storage_path, tmp_path):
    """The driver that owns run.json (group rank 0, with global rank 0) is SIGKILLed:
    the other re-forms the job alone (num_workers=(1, 2)) with its worker in the same
    process (now rank 0), takes run.json over, resumes from the latest checkpoint and
    finishes; no etcd key of the run is left."""
    name = "fit2-kill"
    out_dir, procs, logs = _start_two(tmp_path, storage_path, name, "etcd", etcd_endpoint,
                                      (1, 2), 6)
    try:
        marker = os.path.join(storage_path, name, "checkpoint_000001", ".commit.json")
        assert wait_until(lambda: os.path.exists(marker), 150), "no checkpoint committed"
        owner = _run_json(storage_path, name)["launches"][0]["pid"]
        killed = next(p for p in procs if p.pid == owner)
        killed.send_signal(signal.SIGKILL)
        survivor = next(p for p in procs if p is not killed)
        assert survivor.wait(180) == 0
    finally:
        _stop(procs, logs)
    attempts = _attempts(out_dir)
    assert attempts[0] == (0, 2) and attempts[-1][1] == 1, attempts
    assert attempts[-1][0] >= 2, attempts  # resumed from a checkpoint, not from scratch
    pids = [tuple(map(int, line.split())) for line in (out_dir / "pids").read_text()
            .splitlines()]
    survivor_pid = next(pid for rank, pid in pids if rank == 1)
    assert pids[-1] == (0, survivor_pid), pids  # the survivor's worker kept its process
    assert len({pid for _, pid in pids}) == 2, pids
    assert _results(tmp_path) == ["iteration=6 checkpoint=checkpoint_000005 world=1"]
    state = _run_json(storage_path, name)
    assert state["status"] == "finished"
    assert [launch["pid"] for launch in state["launches"]] == [owner, survivor.pid]
    assert run_keys(etcd_endpoint, name) == [], "the run's etcd keys outlived the job"
