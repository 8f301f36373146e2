"""``elastic-train launch --rdzv-backend etcd`` (our native etcd handler) with many agents on
this machine: a node not needed by a full job, 16 agents, and an agent starved of CPU.

The workers are :mod:`tests.e2e.scripts.rdzv_light_worker` (no torch), so that the agents' own
work is what is measured. Losing a node, a node coming back and the run's keys
being deleted at the end are covered by test_e2e_launch's three-agent test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.support.etcd_server import run_keys
from tests.support.node_policies import ADMITTED_VARIABLE
from tests.support.paths import REPO
from tests.support.servers import stop_process

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("no_leaked_processes")]

WORKER = os.path.join(REPO, "tests", "e2e", "scripts", "rdzv_light_worker.py")


def agent(nnodes: str, endpoint: str, run_id: str, out: Path, log: Path,
          seconds: float | None = None, flags: tuple[str, ...] = (),
          env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """One agent of the job, as its own node, writing to ``log``; ``flags`` go to
    ``launch``, ``env`` into the agent's environment."""
    worker = [WORKER, str(out)] + ([str(seconds)] if seconds else [])
    with open(log, "wb") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "elastic_train.cli", "launch", "--nnodes", nnodes,
             "--nproc-per-node", "1", "--rdzv-backend", "etcd", "--rdzv-endpoint", endpoint,
             "--rdzv-id", run_id, "--storage-path", str(out / "runs"), *flags, "--no-python",
             sys.executable, *worker], cwd=REPO, stdout=f, stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def starts(out: Path) -> list[tuple[int, int, int]]:
    path = out / "starts"
    if not path.exists():
        return []
    return [tuple(map(int, line.split())) for line in path.read_text().splitlines()]


@pytest.mark.compat
@pytest.mark.timeout(180)
def test_a_node_not_needed_by_a_full_job_exits_cleanly(etcd_endpoint: str, tmp_path) -> None:
    """``--nnodes 2`` with 3 agents: the third waits as a spare (torch's redundancy list);
    when the job is done and closes the rendezvous, it exits 0 instead of failing."""
    procs = [agent("2", etcd_endpoint, "spare", tmp_path, tmp_path / f"node{i}.log", 5)
             for i in range(3)]
    try:
        codes = [proc.wait(150) for proc in procs]
    finally:
        for proc in procs:
            stop_process(proc)
    logs = [(tmp_path / f"node{i}.log").read_text() for i in range(3)]
    assert codes == [0, 0, 0], logs
    assert sorted((rank, world) for rank, world, _ in starts(tmp_path)) == [(0, 2), (1, 2)]
    assert run_keys(etcd_endpoint, "spare") == []


@pytest.mark.long  # ~3 min here: 16 agents start on 2 cores
@pytest.mark.timeout(400)
def test_sixteen_agents_and_one_starved_of_cpu_is_not_dropped(etcd_endpoint: str,
                                                              tmp_path) -> None:
    """16 agents on this 2-core machine form one job; one agent is then stopped (SIGSTOP)
    for a second, as a starved node would be, and no agent restarts its workers: nobody
    was dropped (a dropped node leaves, the others re-rendezvous)."""
    count = 16
    procs = [agent(str(count), etcd_endpoint, "sixteen", tmp_path, tmp_path / f"node{i}.log")
             for i in range(count)]
    try:
        assert wait_until(lambda: len(starts(tmp_path)) >= count, 300), \
            (tmp_path / "node0.log").read_text()[-2000:]
        assert sorted((r, w) for r, w, _ in starts(tmp_path)) == [(r, count) for r in range(count)]
        procs[5].send_signal(signal.SIGSTOP)
        time.sleep(1.0)
        procs[5].send_signal(signal.SIGCONT)
        time.sleep(20)  # longer than a lease (5 s x 3) and than torch's last call
        assert len(starts(tmp_path)) == count, "a worker group was restarted"
        (tmp_path / "stop").touch()
        codes = [proc.wait(120) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
            stop_process(proc)
    assert codes == [0] * count
    assert run_keys(etcd_endpoint, "sixteen") == []


@pytest.mark.timeout(180)
def test_a_node_the_sealers_policy_does_not_admit_leaves_and_the_job_goes_on(
        etcd_endpoint: str, tmp_path) -> None:
    """``--nnodes 1:2`` with a node policy (``--rdzv-conf node_policy=...``): node
    127.0.0.1 seals round 0 and its policy admits only itself; node localhost, whose own
    policy admits it, joins during the last call and is left out. It exits with an error
    naming it and the sealer's reason; the job runs on the sealer alone."""
    policy = "node_policy=tests.support.node_policies:AdmitListed,last_call_timeout=15"
    flags = ("--rdzv-conf", policy, "--local-addr")
    sealer = agent("1:2", etcd_endpoint, "policy", tmp_path, tmp_path / "node0.log", 3,
                   (*flags, "127.0.0.1"), {ADMITTED_VARIABLE: "127.0.0.1"})
    procs = [sealer]
    try:
        assert wait_until(lambda: any(k.endswith(b"/c/sealer")
                                      for k in run_keys(etcd_endpoint, "policy")), 60), \
            (tmp_path / "node0.log").read_text()[-2000:]
        procs.append(agent("1:2", etcd_endpoint, "policy", tmp_path, tmp_path / "node1.log",
                           3, (*flags, "localhost"),
                           {ADMITTED_VARIABLE: "127.0.0.1,localhost"}))
        codes = [proc.wait(120) for proc in procs]
    finally:
        for proc in procs:
            stop_process(proc)
    logs = [(tmp_path / f"node{i}.log").read_text() for i in range(2)]
    assert codes == [0, 1], logs
    assert "Node localhost left the job: not admitted by the sealer of round 0: localhost " \
           "is not on the test's list" in logs[1], logs[1]
    assert [(rank, world) for rank, world, _ in starts(tmp_path)] == [(0, 1)]
