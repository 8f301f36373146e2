"""Node care under ``elastic-train launch``, with several agents on this machine: a node
sent away by its node policy cools off, even when its agent is started again at once.

The agents meet on our etcd handler (:mod:`elastic_train.agent.rendezvous.etcd_native`)
and run :mod:`tests.e2e.scripts.launch_script`, whose nodes are named by ``ET_TEST_NODE`` (the
same as their ``--local-addr``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from elastic_train.storage import RunStorage
from tests.conftest import wait_until
from tests.support.etcd_server import run_keys
from tests.support.launched import run_state
from tests.support.node_policies import SICK_FILE
from tests.support.paths import REPO
from tests.support.servers import stop_process

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("no_leaked_processes")]

SCRIPT = os.path.join(REPO, "tests", "e2e", "scripts", "launch_script.py")


def agent(endpoint: str, run_id: str, out: Path, log: Path, addr: str, flags: tuple = (),
          script: tuple = (), env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """One agent of the job, as node ``addr`` (``--local-addr`` and ``ET_TEST_NODE``) with
    one worker, writing to ``log``; ``flags`` go to ``launch``, ``script`` to the script."""
    with open(log, "wb") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "elastic_train.cli", "launch", "--nproc-per-node", "1",
             "--rdzv-backend", "etcd", "--rdzv-endpoint", endpoint, "--rdzv-id", run_id,
             "--local-addr", addr, "--storage-path", str(out / "runs"), *map(str, flags),
             SCRIPT, str(out), *map(str, script)], cwd=REPO, stdout=f,
            stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1", "ET_TEST_NODE": addr, **(env or {})})


def worlds(out: Path) -> list[int]:
    """The world size of each start of the job, in order (launch_script's ``starts``)."""
    path = out / "starts"
    return [int(line.split()[1]) for line in path.read_text().splitlines()] \
        if path.exists() else []


def sealed(endpoint: str, run_id: str) -> bool:
    return any(k.endswith(b"/c/sealer") for k in run_keys(endpoint, run_id))


@pytest.mark.long  # 30-60 s here: a 12 s cooling-off period, four agent starts
@pytest.mark.timeout(300)
def test_a_node_sent_away_is_refused_while_it_cools_off_and_admitted_after(
        etcd_endpoint: str, tmp_path) -> None:
    """``--nnodes 1:2`` under a health policy with a 12 s cooling-off period: node
    localhost's check fails after a failure charged to it, and it leaves; the job goes on
    with node 127.0.0.1. Its agent, started again at once (healthy now), refuses itself,
    naming the time left; started once the period is over, it is admitted and the job
    is whole again. ``run.json`` and the console of the node recording the run say who
    left, why and for how long."""
    flags = ("--nnodes", "1:2", "--max-restarts", 3, "--rdzv-conf",
             "node_policy=tests.support.node_policies:SickWhileMarked")
    script = (80, "--sleep", 0.3, "--slow-below-world", 2, "--crash-file", tmp_path / "crash")
    sick = tmp_path / "sick-localhost"
    node1 = {SICK_FILE: str(sick)}

    def start(log: str, addr: str, env=None):
        return agent(etcd_endpoint, "cooling", tmp_path, tmp_path / log, addr, flags, script,
                     env)

    procs = [start("node0.log", "127.0.0.1")]
    try:
        assert wait_until(lambda: sealed(etcd_endpoint, "cooling"), 60)
        procs.append(start("node1.log", "localhost", node1))
        assert wait_until(lambda: 2 in worlds(tmp_path), 90), \
            (tmp_path / "node1.log").read_text()[-2000:]  # (node0 may have started alone)
        sick.touch()
        (tmp_path / "crash").write_text("localhost")
        assert procs[1].wait(90) == 1
        left = (tmp_path / "node1.log").read_text()
        assert ("Node localhost left the job: health check 'command sh -c" in left
                and "marked sick. It is not admitted again for 12 s of cooling off" in left), \
            left[-3000:]
        sick.unlink()  # healthy again: only the cooling-off period keeps it out
        procs.append(start("node1-again.log", "localhost", node1))
        assert procs[2].wait(90) == 1
        refused = (tmp_path / "node1-again.log").read_text()
        remaining = re.search(r"not admitted: localhost left the job at .* \(health check "
                              r".*marked sick\) and cools off for another (\d+) s", refused)
        assert remaining and 0 < int(remaining.group(1)) <= 12, refused[-3000:]
        [departure] = RunStorage.open(str(tmp_path / "runs"), "cooling").read_departures()
        time.sleep(departure.remaining_s() + 0.5)
        procs.append(start("node1-later.log", "localhost", node1))
        codes = [procs[0].wait(150), procs[3].wait(60)]
    finally:
        for proc in procs:
            stop_process(proc)
    logs = [(tmp_path / f"{name}.log").read_text() for name in ("node0", "node1-later")]
    assert codes == [0, 0], logs[1][-3000:]
    after = worlds(tmp_path)[worlds(tmp_path).index(2):]  # from the job's first two nodes
    assert after[:2] == [2, 1] and after[-1] == 2, worlds(tmp_path)
    state = run_state(str(tmp_path / "runs"), "cooling")
    [recorded] = state["departures"]
    assert recorded["node"] == "localhost" and recorded["cool_off_s"] == 12
    assert "marked sick" in recorded["reason"] and state["status"] == "finished"
    assert "Node localhost left the job: health check" in logs[0]
    assert "not admitted again for 12 s, until" in logs[0]
    shown = subprocess.run([sys.executable, "-m", "elastic_train.cli", "show",
                            str(tmp_path / "runs" / "cooling")], cwd=REPO, capture_output=True,
                           text=True, timeout=60)
    assert "left:     1 node(s)" in shown.stdout, shown.stdout + shown.stderr
    assert "Node localhost left the job: health check" in shown.stdout


def parked(endpoint: str, run_id: str) -> bool:
    """Whether a spare waits in our etcd handler (``r/<round>/s/<node>``)."""
    return any(b"/s/" in k for k in run_keys(endpoint, run_id))


@pytest.mark.long  # ~40 s here: three agents, a restart
@pytest.mark.timeout(300)
def test_a_spare_takes_a_lost_nodes_place_and_the_world_size_is_kept(etcd_endpoint: str,
                                                                     tmp_path) -> None:
    """``--nnodes 2 --spares 1`` with three agents: two train, the third waits parked. One
    of the two is SIGKILLed (its worker dies with it): the job goes on at world size 2
    with the spare, resumes from its latest checkpoint and finishes; its history has
    every iteration once."""
    flags = ("--nnodes", "2", "--spares", "1", "--max-restarts", 3)
    script = (40, "--sleep", 0.3)
    names = ("127.0.0.1", "localhost", "spare")

    def start(i: int):
        return agent(etcd_endpoint, "spares", tmp_path, tmp_path / f"node{i}.log",
                     names[i] if i < 2 else "127.0.0.1", flags, script)

    procs = [start(0)]
    try:
        assert wait_until(lambda: sealed(etcd_endpoint, "spares"), 60)
        procs.append(start(1))
        assert wait_until(lambda: worlds(tmp_path) == [2], 90), \
            (tmp_path / "node1.log").read_text()[-2000:]
        procs.append(start(2))
        assert wait_until(lambda: parked(etcd_endpoint, "spares"), 90), \
            (tmp_path / "node2.log").read_text()[-2000:]
        assert worlds(tmp_path) == [2], "the spare joined a job that had its nodes"
        procs[1].kill()  # the node is lost: its worker dies with its agent
        procs[1].wait()
        codes = [procs[0].wait(180), procs[2].wait(60)]
    finally:
        for proc in procs:
            stop_process(proc)
    logs = [(tmp_path / f"node{i}.log").read_text() for i in (0, 2)]
    assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    assert worlds(tmp_path) == [2, 2], worlds(tmp_path)  # never fewer than 2 workers
    rows = RunStorage.open(str(tmp_path / "runs"), "spares").read_metrics()
    assert [r["training_iteration"] for r in rows] == list(range(1, 41))
    assert {r["world_size"] for r in rows} == {2}
