"""A node SIGKILLed (agent and worker) among three ``launch`` agents: the survivors know it is
gone at once, wait for it no longer, and none of them is charged for it.

Before node liveness, a survivor whose worker raised gloo's "Connection reset by peer"
(in-process restarts: the script's @restart_in_process) was charged for the loss
("Worker group failed (failure) ... restart(s) left"), the in-process barrier waited
``unwind_timeout_s`` + 5 s for the dead node, and the failure exchange of a restart in
new processes waited 3 s for its report.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import wait_until
from tests.support.launched import latest_world, run_state, starts
from tests.support.paths import REPO
from tests.support.servers import free_port, stop_process

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240),
              pytest.mark.usefixtures("no_leaked_processes")]

SCRIPT = os.path.join(REPO, "tests/e2e/scripts/launch_script.py")


def _agent(i, name, backend_args, out_dir, storage_path, log, restart):
    return subprocess.Popen(
        [sys.executable, "-m", "elastic_train.cli", "launch", "--nnodes", "2:3",
         "--nproc-per-node", "1", *backend_args, "--rdzv-id", name, "--name", name,
         "--storage-path", storage_path, "--max-restarts", "2", SCRIPT, out_dir, "60",
         "--sleep", "0.1", *restart], cwd=REPO, text=True, stdout=log,
        stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})


# torch's dynamic handler (c10d) drops a node once its heartbeats are interval x 3 old:
# with 15 s, the survivors of a lost node waited 45 s for the next round (before they
# dropped the node known gone from the state themselves).
SLOW_HEARTBEATS = ("--rdzv-conf", "keep_alive_interval=15")


@pytest.mark.parametrize("restart", [(), ("--restartable",)],
                         ids=["new-processes", "in-process"])
@pytest.mark.parametrize("backend", ["c10d", "etcd", "c10d-slow-heartbeats"])
def test_a_lost_node_is_known_gone_at_once_and_charged_to_no_survivor(
        request, storage_path, tmp_path, backend, restart):
    if backend == "etcd":
        endpoint = request.getfixturevalue("etcd_endpoint")
    else:
        endpoint = f"127.0.0.1:{free_port()}"
    name = f"lost-{backend}-{len(restart)}"
    backend_args = ["--rdzv-backend", backend.split("-")[0], "--rdzv-endpoint", endpoint,
                    *(SLOW_HEARTBEATS if backend.endswith("heartbeats") else ())]
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    logs = [open(tmp_path / f"node{i}.log", "w") for i in range(3)]  # noqa: SIM115
    procs = []
    try:
        for i, log in enumerate(logs):
            procs.append(_agent(i, name, backend_args, out_dir, storage_path, log, restart))
            if i == 0:  # node 0 writes the run (and hosts c10d's store): never the one killed
                time.sleep(2)
        assert wait_until(lambda: latest_world(out_dir) == 3, 120), starts(out_dir)
        assert wait_until(lambda: os.path.exists(os.path.join(
            storage_path, name, "checkpoint_000002", ".commit.json")), 90)
        before = len(starts(out_dir))
        killed_at = time.time()
        procs[2].send_signal(signal.SIGKILL)  # its worker dies with it (PR_SET_PDEATHSIG)
        assert wait_until(lambda: any(w == 2 for _, w in starts(out_dir)[before:]), 90)
        resumed = time.time() - killed_at  # the survivors' rank 0 started with world 2
        for proc in procs[:2]:
            assert proc.wait(150) == 0
    finally:
        for proc in procs:
            stop_process(proc)
        for log in logs:
            log.close()
    outputs = [(tmp_path / f"node{i}.log").read_text() for i in range(2)]
    for out in outputs:  # each survivor knew; the loss was free (the run's writer says so)
        assert "Worker group failed (failure)" not in out, out[-4000:]
        assert "] are gone: their agents do not answer." in out, out[-4000:]
    assert any("Worker group failed (peer)" in out for out in outputs), outputs
    state = run_state(storage_path, name)
    assert state["status"] == "finished"
    lost = [f for f in state["failures"] if f["time"] >= killed_at]
    assert lost and all(f["kind"] == "peer" for f in lost), lost
    assert all(f["restarts_left"] == 2 for f in lost), lost  # the budget is untouched
    # Known gone within about a second: the failure was decided without a 3 s wait for the
    # lost node's report, and the group went on without a 15 s in-process barrier.
    seen = min(f["time"] for f in lost) - killed_at
    print(f"decided {seen:.2f} s and restarted {resumed:.2f} s after the kill")
    assert seen < 2.5, f"the survivors decided {seen:.2f} s after the kill"
    assert resumed < 12, f"the survivors started again {resumed:.2f} s after the kill"
