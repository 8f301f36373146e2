"""Workers forked from the zygote behave, towards the agent, like fresh processes:
streams, environment and directory are the client's; signals pass through; exit
codes and deaths by signal come back; no worker outlives its client or the zygote."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from elastic_train._internal import env_vars
from elastic_train.agent.worker_slots import surviving
from elastic_train.agent.zygote import server as zygote
from tests.conftest import wait_until
from tests.support.paths import REPO
from tests.support.process_tree import child_pids

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")]


@pytest.fixture(scope="module")
def zyg():
    z = zygote.Zygote()
    yield z
    z.close()


def start(zyg, *argv, **env):
    entry, args = zyg.command("tests.support.zygote_target", argv)
    return subprocess.Popen([entry, *args], cwd=REPO, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, **env})


def worker_pid(proc) -> int:
    line = proc.stdout.readline()
    assert line.startswith("pid "), line
    return int(line.split()[1])


def test_streams_environment_directory_and_exit_code(zyg):
    proc = start(zyg, "exit", "3", ZYGOTE_TEST_VALUE="from-the-client")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 3
    assert f"cwd {REPO} value from-the-client" in out


def test_thread_count_follows_the_clients_environment(zyg):
    proc = start(zyg, "threads", OMP_NUM_THREADS="1")
    out, _ = proc.communicate(timeout=60)
    assert "threads 1" in out


def test_each_worker_gets_its_own_random_seed_as_a_new_process_does(zyg):
    """torch 2.9+ seeds a new process at random; forked workers must not share a seed."""
    seeds = []
    for _ in range(2):
        out, _ = start(zyg, "seed").communicate(timeout=60)
        seeds.append(next(line for line in out.splitlines() if line.startswith("seed ")))
    assert seeds[0] != seeds[1]


def test_signals_are_passed_on(zyg):
    proc = start(zyg, "wait-for-term")
    worker_pid(proc)
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGTERM)  # a preemption notice: the worker's handler runs
    assert proc.wait(timeout=30) == 7


def test_a_worker_killed_by_a_signal_kills_its_client_likewise(zyg):
    proc = start(zyg, "sleep")
    pid = worker_pid(proc)
    assert proc.stdout.readline() == "ready\n"
    os.kill(pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL


def test_a_killed_client_takes_its_worker_along(zyg):
    proc = start(zyg, "sleep")
    pid = worker_pid(proc)
    assert proc.stdout.readline() == "ready\n"
    proc.kill()
    proc.wait()
    assert surviving([pid], wait_s=10) == {}


def test_closing_the_zygote_kills_its_workers():
    z = zygote.Zygote()
    try:
        proc = start(z, "sleep")
        pid = worker_pid(proc)
        assert proc.stdout.readline() == "ready\n"
    finally:
        z.close()
    assert surviving([pid], wait_s=10) == {}
    assert proc.wait(timeout=30) == -signal.SIGKILL
    # A later command starts a new zygote.
    again = start(z, "exit", "0")
    assert again.wait(timeout=60) == 0
    z.close()


def test_only_this_packages_worker_modules_use_it(monkeypatch):
    monkeypatch.delenv(env_vars.ZYGOTE, raising=False)
    plain = ("train.py", "--lr", "0.1")
    assert zygote.worker_command("/bin/true", plain) == ("/bin/true", plain)
    assert zygote.worker_command(sys.executable, ("-m", "mypkg.train")) == \
        (sys.executable, ("-m", "mypkg.train"))
    monkeypatch.setenv(env_vars.ZYGOTE, "0")
    fit = ("-m", "elastic_train.worker.fit_worker", "spec.pkl", "/tmp/x")
    assert zygote.worker_command(sys.executable, fit) == (sys.executable, fit)


def test_a_client_gone_before_its_worker_started_leaves_the_zygote_serving(zyg):
    """A stand-in killed right after its request (a group stopped as it starts): the
    zygote's answer finds nobody; it must go on serving, and kill that worker."""
    _, (*_, path, pid, _module) = zyg.command("tests.support.zygote_target", ())
    no_standby = {env_vars.STANDBY: "0"}  # so the zygote's only child is that worker
    request = {"module": "tests.support.zygote_target", "argv": ["sleep"], "cwd": REPO,
               "env": {**os.environ, **no_standby}}
    assert wait_until(lambda: os.path.exists(path), 120)  # bound once torch is imported
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        sock.connect(path)
        socket.send_fds(sock, [json.dumps(request).encode()], [0, 1, 2])
    again = start(zyg, "exit", "0", **no_standby)  # served after the client that left
    assert again.wait(timeout=60) == 0
    assert zyg.pid == int(pid), "the zygote died"
    assert wait_until(lambda: child_pids(int(pid)) == [], 10), "its worker was left running"


def _started(pid: int) -> int:
    """When the process started, in clock ticks since boot."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def _standby_of(z, *taken: int) -> int:
    """The zygote's standby, once it is forked (another than those ``taken``)."""
    assert wait_until(lambda: z.standby_pid not in (None, *taken), 30), z.standby_pid
    standby = z.standby_pid
    assert standby in child_pids(z.pid)
    return standby


def test_a_standby_forked_ahead_serves_the_next_worker_as_a_fork_would():
    z = zygote.Zygote()
    try:
        assert start(z, "exit", "0").wait(timeout=120) == 0
        standby = _standby_of(z)
        proc = start(z, "exit", "3", ZYGOTE_TEST_VALUE="from-the-client")
        out, _ = proc.communicate(timeout=60)
        assert out.startswith(f"pid {standby} cwd {REPO} value from-the-client"), out
        assert proc.returncode == 3
        following = _standby_of(z, standby)  # a new one waits for the next request
        # /proc's start times count 10 ms ticks: the client starts a few ticks later.
        time.sleep(0.05)
        # Forked before the request (its stand-in started after it), yet a worker of its
        # own: a new random seed, as a new process gets.
        proc = start(z, "seed")
        pid = worker_pid(proc)
        assert pid == following and _started(pid) < _started(proc.pid)
        seeds = {proc.communicate(timeout=60)[0],
                 start(z, "seed").communicate(timeout=60)[0]}
        assert len(seeds) == 2, seeds
    finally:
        z.close()


def test_without_a_standby_each_worker_is_forked_on_request():
    z = zygote.Zygote()
    off = {env_vars.STANDBY: "0"}
    try:
        assert start(z, "exit", "0", **off).wait(timeout=120) == 0
        proc = start(z, "sleep", **off)
        pid = worker_pid(proc)
        assert _started(pid) >= _started(proc.pid)
        assert child_pids(z.pid) == [pid]
        proc.kill()
        proc.wait()
    finally:
        z.close()


def test_a_standby_that_dies_unasked_is_forked_again():
    z = zygote.Zygote()
    try:
        assert start(z, "exit", "0").wait(timeout=120) == 0
        standby = _standby_of(z)
        os.kill(standby, signal.SIGKILL)
        _standby_of(z, standby)
        assert start(z, "exit", "0").wait(timeout=60) == 0
    finally:
        z.close()


def test_a_standby_warmed_for_cuda_serves_only_workers_of_the_same_devices():
    """The workers reported CUDA use (as their first report() does): the standby warms
    CUDA under the last request's CUDA variables (here it fails: no GPU; the worker
    would meet that itself). A worker asking for other devices is forked instead."""
    z = zygote.Zygote()
    devices = {"CUDA_VISIBLE_DEVICES": "0"}
    try:
        assert start(z, "exit", "0", **devices).wait(timeout=120) == 0
        cold = _standby_of(z)
        assert z.preload([], cuda=True) is not None
        warm = _standby_of(z)
        assert warm != cold  # retired: it had not warmed CUDA
        proc = start(z, "sleep", **devices)
        assert worker_pid(proc) == warm
        proc.kill()
        proc.wait()
        warm = _standby_of(z, warm)
        proc = start(z, "sleep", CUDA_VISIBLE_DEVICES="1")
        forked = worker_pid(proc)
        assert forked != warm
        proc.kill()
        proc.wait()
        # The next standby warms the devices the last worker asked for.
        warm = _standby_of(z, forked)
        proc = start(z, "sleep", CUDA_VISIBLE_DEVICES="1")
        assert worker_pid(proc) == warm
        proc.kill()
        proc.wait()
    finally:
        z.close()


@pytest.mark.e2e
def test_workers_import_the_users_modules_in_their_own_environment(tmp_path):
    """A zygote forked from the driver holds the modules the driver imported; a user
    module among them (here the train function's) is imported again by each worker, in
    its own environment, as a fresh worker process would."""
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run([sys.executable, "-m", "tests.e2e.scripts.import_env_driver",
                           str(tmp_path / "results"), str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {p.name: p.read_text() for p in out.iterdir()} == {"rank-0": "0", "rank-1": "1"}


@pytest.mark.e2e
def test_a_forked_zygote_that_fails_to_start_is_reported_and_replaced(tmp_path):
    """The zygote forked from the driver dies as it starts: fit() warns with its traceback,
    records it in run.json, and runs on a zygote started as a new interpreter -- the
    injected SIGKILL is the only failure, in both runs (the second does not fork again)."""
    proc = subprocess.run([sys.executable, "tests/e2e/scripts/layout_driver.py", "fit-broken-fork",
                           str(tmp_path / "results"), "2"], cwd=REPO, capture_output=True,
                          text=True, timeout=200)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    runs = [json.loads(line[len("ZYGOTE "):]) for line in proc.stdout.splitlines()
            if line.startswith("ZYGOTE ")]
    assert [(r["forked"], r["failures"]) for r in runs] == [(False, 1), (False, 1)], out
    [error] = runs[0]["zygote_errors"]
    assert error["forked"] and "injected: the zygote cannot shed the driver" in error["error"]
    assert runs[1]["zygote_errors"] == []
    assert "failed to start" in out and "RuntimeError: injected" in out
