"""A node lost, or a node joining, under ``launch`` with the wrapper: the workers already
running keep their processes.

One node's whole process group (agent, zygote, workers) is SIGKILLed. The surviving
workers leave the attempt, their agents rendezvous again without the lost node and hand
them their new ranks: they form the smaller group in the same processes and continue
from the last commit. A node that joins a running job is met the same way: the running
workers leave the attempt (nothing failed), and form the larger group with it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from elastic_train.goodput.breakdown import Cause
from elastic_train.result import Result
from tests.conftest import wait_until
from tests.support.launched import (
    SCRIPT,
    latest_world,
    rank_starts,
    rdzv_args,
    run_state,
    start_node,
    starts,
    worker_pids,
)
from tests.support.ledger_account import assert_adds_up
from tests.support.rendezvous_state import c10d_spare_parked, c10d_store
from tests.support.servers import free_port, stop_process

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("no_leaked_processes")]

EPOCHS = 14


def _kill_node(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def _commit_into_latest_start(storage_path: str, name: str, out_dir) -> str:
    """The commit marker of the checkpoint two epochs into the latest start. A node killed
    once it exists is lost mid-run, also when the last node joined late (the job then ran
    a while at the smaller world size first)."""
    first_epoch = starts(out_dir)[-1][0]
    return os.path.join(storage_path, name, f"checkpoint_{first_epoch + 2:06d}", ".commit.json")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", ["c10d", "etcd"])
def test_lost_node_survivors_keep_their_processes(request, storage_path, tmp_path, backend):
    """Three agents (``--nnodes 2:3``, one worker each); a node that is not the c10d
    store's host is lost."""
    backend_args = rdzv_args(request, backend)
    name = f"lost-{backend}"
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    logs = [open(tmp_path / f"node{i}.log", "w") for i in range(3)]  # noqa: SIM115
    procs: list[subprocess.Popen] = []
    try:
        for i, log in enumerate(logs):
            procs.append(start_node(["--nnodes", "2:3", "--nproc-per-node", 1, *backend_args,
                                "--rdzv-id", name, "--max-restarts", 2, "--unwind-timeout",
                                2, "--storage-path", storage_path, SCRIPT, out_dir, EPOCHS,
                                "--sleep", 0.3, "--restartable"], log))
            if i == 0 and backend == "c10d":
                time.sleep(2)  # node 0 hosts the c10d store: it must outlive the others
        assert wait_until(lambda: latest_world(out_dir) == 3, 90), starts(out_dir)
        assert wait_until(lambda: len(worker_pids(out_dir)) == 3, 30)
        survivors = set(worker_pids(out_dir))
        commit = _commit_into_latest_start(storage_path, name, out_dir)
        assert wait_until(lambda: os.path.exists(commit), 60)
        before = starts(out_dir)
        _kill_node(procs[2])
        assert wait_until(lambda: len(starts(out_dir)) > len(before), 60), starts(out_dir)
        codes = [proc.wait(120) for proc in procs[:2]]
    finally:
        for proc in procs:
            stop_process(proc)
        for log in logs:
            log.close()
    node_logs = [(tmp_path / f"node{i}.log").read_text()[-3000:] for i in range(2)]
    assert codes == [0, 0], node_logs
    # No new process on the surviving nodes: every pid that ran is one of the first three.
    assert set(worker_pids(out_dir)) == survivors, node_logs
    after = starts(out_dir)[len(before):]
    assert after and all(w == 2 for _, w in after), starts(out_dir)
    rows = Result.from_path(os.path.join(storage_path, name)).metrics_dataframe
    assert list(rows["training_iteration"]) == list(range(1, EPOCHS + 1))
    assert list(rows["epoch"]) == list(range(EPOCHS))  # resumed from the last commit
    state = run_state(storage_path, name)
    assert state["status"] == "finished"


@pytest.mark.timeout(180)
def test_lost_rank_0_node_survivors_take_the_lower_ranks(etcd_endpoint, storage_path, tmp_path):
    """Two agents of two workers each (``--nnodes 1:2``, etcd); the node holding rank 0
    is lost. The other node's two processes become ranks 0 and 1 of a world of 2 (their
    rank 0 hosts the new group's store) and finish the run."""
    name = "lost-rank0"
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    logs = [open(tmp_path / f"node{i}.log", "w") for i in range(2)]  # noqa: SIM115
    procs = [start_node(["--nnodes", "1:2", "--nproc-per-node", 2, "--rdzv-backend", "etcd",
                    "--rdzv-endpoint", etcd_endpoint, "--rdzv-id", name, "--max-restarts", 2,
                    "--unwind-timeout", 2, "--storage-path", storage_path, SCRIPT, out_dir,
                    EPOCHS, "--sleep", 0.3, "--restartable"], log, node)
             for node, log in enumerate(logs)]
    try:
        assert wait_until(lambda: latest_world(out_dir) == 4, 90), starts(out_dir)
        assert wait_until(lambda: [w for _, w, _, _ in rank_starts(out_dir)[-4:]] == [4] * 4, 30)
        world_4 = rank_starts(out_dir)[-4:]
        lost_node = next(node for rank, _, _, node in world_4 if rank == 0)
        lost, survivor = procs[lost_node], procs[1 - lost_node]
        survivors = {pid for _, _, pid, node in world_4 if node != lost_node}
        commit = _commit_into_latest_start(storage_path, name, out_dir)
        assert wait_until(lambda: os.path.exists(commit), 60)
        before = len(rank_starts(out_dir))
        _kill_node(lost)
        code = survivor.wait(120)
    finally:
        for proc in procs:
            stop_process(proc)
        for log in logs:
            log.close()
    node_log = (tmp_path / f"node{1 - lost_node}.log").read_text()[-3000:]
    assert code == 0, node_log
    assert len(survivors) == 2, rank_starts(out_dir)
    after = rank_starts(out_dir)[before:]
    assert after and {world for _, world, _, _ in after} == {2}, rank_starts(out_dir)
    assert {rank for rank, _, _, _ in after} == {0, 1}
    assert {pid for _, _, pid, _ in after} == survivors, node_log  # the same two processes
    result = Result.from_path(os.path.join(storage_path, name))
    assert list(result.metrics_dataframe["epoch"]) == list(range(EPOCHS))
    assert run_state(storage_path, name)["status"] == "finished"
    # The survivor records the run from its takeover on: the lost node's fault and the
    # re-formed group are in the ledger, not time that no writer accounted for.
    assert_adds_up(result.goodput)
    assert result.goodput.failures == 1, result.goodput.to_json()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", ["c10d", "etcd"])
def test_a_joining_node_leaves_the_running_workers_in_their_processes(
        request, storage_path, tmp_path, backend):
    """Two agents (``--nnodes 2:3``) train; a third joins. The first two nodes' workers
    take their places in the world of 3 in the same processes (they were restarted as new
    processes before), from the last commit, and nothing is charged."""
    backend_args = rdzv_args(request, backend)
    name = f"join-{backend}"
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    logs = [open(tmp_path / f"node{i}.log", "w") for i in range(3)]  # noqa: SIM115

    def node(i: int) -> subprocess.Popen:
        return start_node(["--nnodes", "2:3", "--nproc-per-node", 1, *backend_args, "--rdzv-id",
                      name, "--max-restarts", 0, "--unwind-timeout", 4, "--storage-path",
                      storage_path, SCRIPT, out_dir, EPOCHS, "--sleep", 0.3, "--restartable"],
                     logs[i], i)

    procs: list[subprocess.Popen] = []
    try:
        procs.append(node(0))
        time.sleep(2)  # node 0 hosts the c10d store
        procs.append(node(1))
        assert wait_until(lambda: starts(out_dir)[:1] == [(0, 2)], 90), starts(out_dir)
        assert wait_until(lambda: len(worker_pids(out_dir)) == 2, 30)
        first = set(worker_pids(out_dir))
        commit = os.path.join(storage_path, name, "checkpoint_000002", ".commit.json")
        assert wait_until(lambda: os.path.exists(commit), 60)
        procs.append(node(2))
        codes = [proc.wait(150) for proc in procs]
    finally:
        for proc in procs:
            stop_process(proc)
        for log in logs:
            log.close()
    node_logs = [(tmp_path / f"node{i}.log").read_text()[-3000:] for i in range(3)]
    assert codes == [0, 0, 0], node_logs
    after = [(rank, world, pid) for rank, world, pid, _ in rank_starts(out_dir) if world == 3]
    assert len(after) == 3, rank_starts(out_dir)
    assert first <= {pid for _, _, pid in after}, node_logs  # the first two kept theirs
    assert set(worker_pids(out_dir)) == {pid for _, _, pid in after}  # and no other came
    [start, *rest] = starts(out_dir)
    assert start == (0, 2) and rest and rest[-1][1] == 3 and rest[-1][0] > 0, starts(out_dir)
    result = Result.from_path(os.path.join(storage_path, name))
    assert list(result.metrics_dataframe["epoch"]) == list(range(EPOCHS))  # from the last commit
    state = run_state(storage_path, name)
    assert state["status"] == "finished" and not state["failures"], state
    # The re-form for the newcomer is in the ledger (rendezvous, its lost work recompute),
    # not time that no writer accounted for; and it is no failure.
    assert_adds_up(result.goodput)
    assert result.goodput.failures == 0 and result.goodput.seconds[Cause.RENDEZVOUS] > 0


@pytest.mark.timeout(240)
def test_a_spare_takes_a_lost_c10d_nodes_place_before_its_heartbeats_expire(
        storage_path, tmp_path):
    """c10d, ``--nnodes 2 --spares 1``: two agents train, a third waits parked in torch's
    redundancy list. A node that is not the store's host is lost. Its heartbeats
    (``keep_alive_interval=10``, 3 missed) would keep it in torch's rendezvous state for
    20-30 s; the survivor knows it gone from its beacon and drops it at once, so the
    spare takes its place within seconds: the job steps at world size 2 again long
    before, the survivor in its own process."""
    endpoint = f"127.0.0.1:{free_port()}"
    name = "spare-c10d"
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    logs = [open(tmp_path / f"node{i}.log", "w") for i in range(3)]  # noqa: SIM115
    procs: list[subprocess.Popen] = []

    def start(i: int) -> None:
        procs.append(start_node(["--nnodes", 2, "--spares", 1, "--nproc-per-node", 1,
                            "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
                            "--rdzv-id", name, "--rdzv-conf", "keep_alive_interval=10",
                            "--max-restarts", 2, "--storage-path", storage_path, SCRIPT,
                            out_dir, 24, "--sleep", 0.3, "--restartable"], logs[i], i))

    try:
        start(0)
        time.sleep(2)  # node 0 hosts the c10d store: it must outlive the others
        start(1)
        assert wait_until(lambda: starts(out_dir)[:1] == [(0, 2)], 90)
        assert wait_until(lambda: len(worker_pids(out_dir)) == 2, 30)
        start(2)
        store = c10d_store(endpoint)
        assert wait_until(lambda: c10d_spare_parked(store, name), 60), \
            (tmp_path / "node2.log").read_text()[-2000:]
        before = set(worker_pids(out_dir))
        commit = os.path.join(storage_path, name, "checkpoint_000002", ".commit.json")
        assert wait_until(lambda: os.path.exists(commit), 60)
        killed_at = time.monotonic()
        _kill_node(procs[1])
        assert wait_until(lambda: len(starts(out_dir)) >= 2, 12), \
            f"no start {time.monotonic() - killed_at:.1f} s after the loss: {starts(out_dir)}"
        codes = [procs[0].wait(120), procs[2].wait(60)]
    finally:
        for proc in procs:
            stop_process(proc)
        for log in logs:
            log.close()
    node_logs = [(tmp_path / f"node{i}.log").read_text()[-3000:] for i in (0, 2)]
    assert codes == [0, 0], node_logs
    assert {w for _, w in starts(out_dir)} == {2}, starts(out_dir)  # never fewer than 2
    new = set(worker_pids(out_dir)) - before
    assert len(new) == 1, node_logs  # the spare's worker; the survivor kept its process
    rows = Result.from_path(os.path.join(storage_path, name)).metrics_dataframe
    assert list(rows["training_iteration"]) == list(range(1, 25))
