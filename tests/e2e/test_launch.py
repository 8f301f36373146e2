"""``elastic-train launch``: torchrun scripts unchanged, checkpoints and resume for scripts
that use elastic_train, and several agents on this machine forming one elastic job
(c10d and etcd v3), losing a node and taking one back."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from elastic_train.result import Result
from tests.conftest import pid_alive, wait_until
from tests.support.etcd_server import run_keys
from tests.support.launched import (
    CLI,
    SCRIPT,
    latest_world,
    launch,
    run_nodes,
    run_state,
    starts,
    worker_pids,
)
from tests.support.paths import REPO
from tests.support.servers import free_port, stop_process

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240),
              pytest.mark.usefixtures("no_leaked_processes")]


def test_plain_torchrun_script_runs_unchanged():
    proc = launch("--standalone", "--nproc-per-node", 2,
                  "tests/e2e/scripts/plain_torchrun_script.py")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert "[rank0]: ENV rank=0 world=2 sum=2 missing=[]" in out
    assert "[rank1]: ENV rank=1 world=2 sum=2 missing=[]" in out


def test_crash_restarts_and_resumes_then_start_over(storage_path, tmp_path):
    proc = launch("--nproc-per-node", 2, "--max-restarts", 1, "--storage-path", storage_path,
                  "--name", "crash", SCRIPT, tmp_path, 5, "--crash-at", 2)
    out, _ = proc.communicate(timeout=150)
    assert proc.returncode == 0, out
    assert starts(tmp_path) == [(0, 2), (2, 2)]
    state = run_state(storage_path, "crash")
    assert state["status"] == "finished" and len(state["failures"]) == 1
    assert "RuntimeError: crash at epoch 2" in state["failures"][0]["workers"][0]["message"]
    assert state["failures"][0]["restarts_left"] == 0  # its one restart is spent

    run_path = os.path.join(storage_path, "crash")
    restore = subprocess.run([*CLI, "restore", run_path], cwd=REPO, text=True,
                             capture_output=True, timeout=60)
    assert restore.returncode == 2 and "already finished" in restore.stderr
    assert "--start-over" in restore.stderr
    restore = subprocess.run([*CLI, "restore", run_path, "--start-over"], cwd=REPO, text=True,
                             capture_output=True, timeout=150)
    assert restore.returncode == 0, restore.stdout + restore.stderr
    assert starts(tmp_path)[2:] == [(0, 2)]  # from scratch
    state = run_state(storage_path, "crash")
    assert state["status"] == "finished" and len(state["launches"]) == 1
    assert "--start-over" not in state["spec"]["command"]  # a restore continues, never restarts
    archived = [p for p in os.listdir(storage_path) if p.startswith("crash.finished-")]
    assert len(archived) == 1 and len(run_state(storage_path, archived[0])["failures"]) == 1


def test_budget_spent_exit_code_and_message(storage_path, tmp_path):
    proc = launch("--nproc-per-node", 2, "--storage-path", storage_path, "--name", "spent",
                  SCRIPT, tmp_path, 5, "--crash-at", 1)
    out, _ = proc.communicate(timeout=150)
    assert proc.returncode == 1
    assert "rank 1" in out and "crash at epoch 1" in out
    assert "run the same command again" in out and "--max-restarts N" in out
    hint = next(line for line in out.splitlines() if "run the same command again" in line)
    assert hint.count("--storage-path") == 1 and hint.count("--name") == 1, hint


@pytest.mark.parametrize("restart", [(), ("--restartable",)], ids=["new-processes",
                                                                    "in-process"])
def test_a_node_policy_sends_the_node_away_after_two_failures_in_a_row(storage_path,
                                                                      tmp_path, restart):
    """A policy named in --rdzv-conf makes the node leave after its second failure in a
    row, with budget to spare, whether its workers restart as new processes or in
    process: the node exits naming itself and the reason, and, being the job's last
    node, records the run as failed with that reason."""
    proc = launch("--nnodes", 1, "--nproc-per-node", 1, "--rdzv-backend", "c10d",
                  "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-conf",
                  "node_policy=tests.support.node_policies:LeaveAfterTwoInARow",
                  "--max-restarts", 5, "--local-addr", "127.0.0.1", "--storage-path",
                  storage_path, "--name", "leaves", SCRIPT, tmp_path, 5, "--crash-at", 1,
                  "--crash-always", *restart)
    out, _ = proc.communicate(timeout=150)
    assert proc.returncode == 1, out
    left = ("Node 127.0.0.1 left the job: 2 failures in a row. It is not admitted again "
            "for 60 s of cooling off")
    assert left in out
    state = run_state(storage_path, "leaves")
    assert state["status"] == "failed" and left in state["error"]
    assert [f["restarts_left"] for f in state["failures"]] == [4, 3]


def _one_node_with_policy(storage_path, tmp_path, policy, *script_args, restart=()):
    """One launched node on a c10d endpoint under node policy ``policy`` (a class of
    tests/support/node_policies.py), its run named "policy"; its exit code and output."""
    proc = launch("--nnodes", 1, "--nproc-per-node", 1, "--rdzv-backend", "c10d",
                  "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-conf",
                  f"node_policy=tests.support.node_policies:{policy}",
                  "--max-restarts", 5, "--local-addr", "127.0.0.1", "--storage-path",
                  storage_path, "--name", "policy", SCRIPT, tmp_path, 5, *script_args,
                  *restart, env={"ET_TEST_HEALTH_MARKER": str(tmp_path / "starts")})
    out, _ = proc.communicate(timeout=150)
    return proc.returncode, out


@pytest.mark.parametrize("restart", [(), ("--restartable",)], ids=["new-processes",
                                                                    "in-process"])
def test_a_node_whose_health_check_fails_after_a_failure_leaves(storage_path, tmp_path,
                                                                restart):
    """The built-in HealthPolicy checks the node after a failure charged to it: its check
    (a command) now fails, so the node leaves with the check's name and last words
    although the budget has restarts left."""
    code, out = _one_node_with_policy(storage_path, tmp_path, "SickOnceStarted",
                                      "--crash-at", 1, restart=restart)
    assert code == 1, out
    assert "Node 127.0.0.1 left the job: health check 'command sh -c" in out, out
    assert "failed: exit code 3: ECC errors: 12" in out
    state = run_state(storage_path, "policy")
    assert state["status"] == "failed" and "ECC errors: 12" in state["error"]
    assert [f["restarts_left"] for f in state["failures"]] == [4]
    assert starts(tmp_path) == [(0, 1)]  # it never started again


def test_a_node_whose_health_check_fails_is_not_admitted(storage_path, tmp_path):
    """Before it joins the first round, the node checks itself: nothing starts."""
    code, out = _one_node_with_policy(storage_path, tmp_path, "SickFromTheStart")
    assert code == 1, out
    assert "not admitted: health check 'command sh -c" in out, out
    assert "GPU 3 fell off the bus" in out
    assert not (tmp_path / "starts").exists()


@pytest.mark.parametrize("args,message", [
    (["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:1"],
     "--rdzv-id is required"),
    (["--nnodes", "3:2"], "--nnodes='3:2' is invalid"),
    (["--rdzv-backend", "zookeeper"], "not supported"),
    (["--rdzv-conf", "novalue"], "--rdzv-conf item 'novalue'"),
])
def test_bad_flags_fail_before_anything_starts(args, message, tmp_path):
    proc = launch(*args, SCRIPT, tmp_path, 1)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and message in out, out
    assert not (tmp_path / "starts").exists()


@pytest.mark.parametrize("args, env, message", [
    (["--rdzv-conf", "join_timout=5"], {}, "no key 'join_timout'; did you mean join_timeout?"),
    (["--rdzv-backend", "etcd", "--rdzv-endpoint", "127.0.0.1:1", "--rdzv-conf",
      "outage_timeout=30s"], {}, "outage_timeout='30s' is invalid: use a number of seconds"),
    ([], {"ELASTIC_TRAIN_LEASE_TTL_S": "20s"}, "ELASTIC_TRAIN_LEASE_TTL_S='20s' is invalid"),
    ([], {"ELASTIC_TRAIN_ZYGOTE": "nah"}, "ELASTIC_TRAIN_ZYGOTE='nah' is invalid"),
], ids=["rdzv-key", "rdzv-value", "lease-ttl", "zygote"])
def test_a_bad_setting_exits_2_in_one_line_and_leaves_no_run_directory(storage_path, tmp_path,
                                                                      args, env, message):
    began = time.monotonic()
    proc = launch(*args, "--storage-path", storage_path, "--name", "bad", SCRIPT, tmp_path, 1,
                  env=env)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and message in out and out.count("\n") == 1, out
    assert time.monotonic() - began < 30
    assert not os.path.exists(os.path.join(storage_path, "bad"))
    assert not (tmp_path / "starts").exists()


def test_standalone_keeps_the_rdzv_conf_and_its_node_policy(storage_path, tmp_path):
    """torchrun keeps --rdzv-conf under --standalone: the node policy it names runs (its
    health check fails, so the node is not admitted and nothing starts)."""
    proc = launch("--standalone", "--nproc-per-node", 1, "--rdzv-conf",
                  "node_policy=tests.support.node_policies:SickFromTheStart",
                  "--storage-path", storage_path, "--name", "policy", SCRIPT, tmp_path, 5)
    out, _ = proc.communicate(timeout=150)
    assert proc.returncode == 1 and "not admitted: health check" in out, out
    assert not (tmp_path / "starts").exists()


def test_missing_script_is_named(tmp_path):
    proc = launch("--standalone", tmp_path / "nope.py")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "nope.py" in out and "does not exist" in out


@pytest.mark.parametrize("how", ["relaunch", "restore"])
def test_relaunch_after_launcher_sigkill_resumes_bit_identical(storage_path, tmp_path, how):
    straight_dir, killed_dir = tmp_path / "straight", tmp_path / "killed"
    straight_dir.mkdir()
    killed_dir.mkdir()
    args = ("--nproc-per-node", 2, "--storage-path", storage_path)
    proc = launch(*args, "--name", "straight", SCRIPT, straight_dir, 8)
    out, _ = proc.communicate(timeout=150)
    digest = next(line.split()[-1] for line in out.splitlines() if "DIGEST" in line)

    proc = launch(*args, "--name", "killed", SCRIPT, killed_dir, 8, "--sleep", 0.3)
    try:
        marker = os.path.join(storage_path, "killed", "checkpoint_000002", ".commit.json")
        assert wait_until(lambda: os.path.exists(marker), 120)
        workers = worker_pids(killed_dir)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        stop_process(proc)
    assert wait_until(lambda: not any(pid_alive(p) for p in workers), 30), "orphans"
    if how == "relaunch":  # with other arguments first: refused, before anything starts
        proc = launch(*args, "--name", "killed", SCRIPT, killed_dir, 9, "--sleep", 0.3)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 2, out
        assert f"{killed_dir} 8 --sleep 0.3 -> " in out and "--start-over" in out
        assert len(starts(killed_dir)) == 1
        proc = launch(*args, "--name", "killed", SCRIPT, killed_dir, 8, "--sleep", 0.3)
    else:  # the stored command, from the run directory alone
        proc = subprocess.Popen([*CLI, "restore", os.path.join(storage_path, "killed")],
                                cwd=str(tmp_path), text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
    out, _ = proc.communicate(timeout=150)
    assert proc.returncode == 0, out
    assert starts(killed_dir)[0] == (0, 2) and starts(killed_dir)[-1][0] >= 3
    assert f"DIGEST {digest}" in out
    rows = Result.from_path(os.path.join(storage_path, "killed")).metrics_dataframe
    assert list(rows["training_iteration"]) == list(range(1, 9))
    state = run_state(storage_path, "killed")
    assert state["status"] == "finished" and len(state["launches"]) == 2


def _cluster(tmp_path, storage_path, backend_args, name, nodes=3, epochs=40):
    out_dir = tmp_path / name
    out_dir.mkdir()
    logs = []

    def node(i):
        log = open(tmp_path / f"{name}-node{i}.log", "w")
        logs.append(log)
        return launch("--nnodes", "2:3", "--nproc-per-node", 1, *backend_args,
                      "--rdzv-id", name, "--storage-path", storage_path, SCRIPT, out_dir,
                      epochs, "--sleep", 0.25, "--slow-below-world", nodes, out=log)

    return out_dir, node, logs


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["c10d", pytest.param("etcd", marks=pytest.mark.compat)])
def test_three_agents_lose_one_and_take_one_back(request, storage_path, tmp_path, backend):
    if backend == "etcd":
        endpoint = request.getfixturevalue("etcd_endpoint")
        backend_args = ["--rdzv-backend", "etcd", "--rdzv-endpoint", endpoint]
    else:
        backend_args = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
    out_dir, node, logs = _cluster(tmp_path, storage_path, backend_args, f"job-{backend}")
    procs = [node(0)]
    try:
        if backend == "c10d":  # node 0 hosts the c10d store: start it first, keep it alive
            time.sleep(2)
        procs += [node(1), node(2)]
        assert wait_until(lambda: latest_world(out_dir) == 3, 90), starts(out_dir)
        assert wait_until(lambda: os.path.exists(os.path.join(
            storage_path, f"job-{backend}", "checkpoint_000002", ".commit.json")), 60)
        before = len(starts(out_dir))
        killed_at = time.monotonic()
        procs[2].send_signal(signal.SIGKILL)  # an agent dies; its worker dies with it
        assert wait_until(lambda: any(w == 2 for _, w in starts(out_dir)[before:]), 60)
        recovery = time.monotonic() - killed_at
        procs.append(node(3))  # a node comes back
        assert wait_until(lambda: latest_world(out_dir) == 3
                          and len(starts(out_dir)) > before + 1, 90)
        for proc in procs[:2] + procs[3:]:
            assert proc.wait(150) == 0
    finally:
        for proc in procs:
            stop_process(proc)
        for log in logs:
            log.close()
    sizes = [w for _, w in starts(out_dir)[before - 1:]]
    assert sizes[0] == 3 and sizes[1] == 2 and sizes[-1] == 3, starts(out_dir)
    resumed = starts(out_dir)[before][0]
    assert resumed >= 3  # from the latest checkpoint, not from scratch
    assert recovery < 30, f"took {recovery:.1f}s to resume on the survivors"
    state = run_state(storage_path, f"job-{backend}")
    assert state["status"] == "finished"
    # The killed agent's worker died with it (PR_SET_PDEATHSIG): nothing is left over.
    assert wait_until(lambda: not any(pid_alive(p) for p in worker_pids(out_dir)), 30)
    if backend == "etcd":  # the last node out of the finished job deleted the run's keys
        assert run_keys(endpoint, f"job-{backend}") == []


@pytest.mark.timeout(240)
def test_worker_crash_on_one_of_two_nodes_restarts_both(storage_path, tmp_path):
    """Only the crashed node spends a restart; the other's is free. The two agents'
    restart counts then differ, and they must still agree on the next generation
    (a key per restart count made the second rendezvous wait for ever)."""
    codes = run_nodes(tmp_path, 2, "--rdzv-id", "crash2", "--max-restarts", 1,
                      "--storage-path", storage_path, SCRIPT, tmp_path, 5, "--crash-at", 2,
                      "--sleep", 0.2)
    assert codes == [0, 0], [(tmp_path / f"node{i}.log").read_text()[-2000:] for i in (0, 1)]
    assert starts(tmp_path) == [(0, 2), (2, 2)]
    kinds = [f["kind"] for f in run_state(storage_path, "crash2")["failures"]]
    assert "failure" in kinds or "peer" in kinds


@pytest.mark.compat  # torch before 2.12 takes no shutdown timeout: its own stop waits 30 s
@pytest.mark.timeout(120)
def test_sigterm_kills_a_worker_that_ignores_it_after_the_grace(storage_path, tmp_path):
    """SIGTERM to the launcher is the workers' preemption notice; a worker that ignores it
    is killed when --preemption-grace (2 s) ends, not after torch's 30 s default."""
    proc = launch("--nproc-per-node", 1, "--preemption-grace", 2, "--storage-path",
                  storage_path, "--name", "grace", "tests/e2e/scripts/ignore_sigterm_script.py",
                  tmp_path)
    try:
        assert wait_until(lambda: worker_pids(tmp_path), 60), "the worker did not start"
        [worker] = worker_pids(tmp_path)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        took = time.monotonic() - started
    finally:
        stop_process(proc)
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert not pid_alive(worker)
    assert 2 <= took < 15, (took, out)
