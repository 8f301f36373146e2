"""Whose fault a failed attempt is, across nodes: decided from what the agents know
(which node's worker failed by itself, how), never from the words of an error message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.support.paths import REPO
from tests.support.process_tree import stop_tree
from tests.support.servers import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300),
              pytest.mark.usefixtures("no_leaked_processes")]


@pytest.mark.parametrize("skew_s", [0.0, 2.0], ids=["same-clock", "node0-clock-ahead"])
def test_a_node_failing_the_same_way_every_attempt_ends_the_job(storage_path, tmp_path,
                                                                skew_s):
    """Rank 0 raises ConnectionRefusedError in every attempt (as a storage outage that
    outlasts the restarts ends): its node spends its budget (--max-restarts 1), so the
    job ends after two attempts with that error -- on the other node too. Also when
    node 0's clock runs ahead, so that the error it causes on node 1 bears an earlier
    time than its own: the group's order of failures decides, not the clocks."""
    endpoint = f"127.0.0.1:{free_port()}"
    procs, logs = [], []
    try:
        for i in range(2):
            logs.append(open(tmp_path / f"node{i}.log", "w"))  # noqa: SIM115
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "elastic_train.cli", "launch", "--nnodes", "2",
                 "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
                 "--rdzv-id", "refused",
                 "--max-restarts", "1", "--storage-path", storage_path,
                 "tests/e2e/scripts/launch_script.py", str(tmp_path), "6", "--refused-at", "2",
                 "--sleep", "0.2"], cwd=REPO, stdout=logs[-1], stderr=subprocess.STDOUT,
                text=True, env={**os.environ,
                                "ET_TEST_CLOCK_SKEW_S": str(skew_s if i == 0 else 0.0)}))
            if i == 0:
                time.sleep(2)  # node 0 hosts the c10d store (and is group rank 0)
        codes = [proc.wait(200) for proc in procs]
    except subprocess.TimeoutExpired:
        attempts = len((tmp_path / "starts").read_text().splitlines())
        pytest.fail(f"the job still runs after 200 s and {attempts} attempts")
    finally:
        for proc in procs:
            if proc.poll() is None:
                stop_tree(proc.pid)
                proc.wait()
        for log in logs:
            log.close()
    outputs = [(tmp_path / f"node{i}.log").read_text() for i in range(2)]
    assert codes == [1, 1], [out[-3000:] for out in outputs]
    starts = (tmp_path / "starts").read_text().splitlines()
    assert len(starts) == 2, starts  # the first attempt and its one restart
    for out in outputs:
        assert "ConnectionRefusedError" in out, out[-3000:]
    with open(os.path.join(storage_path, "refused", "run.json")) as f:
        state = json.load(f)
    assert state["status"] == "failed" and "ConnectionRefusedError" in state["error"]
    assert [f["kind"] for f in state["failures"]] == ["failure", "failure"]
