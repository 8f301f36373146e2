"""The agent's record of the workers behind zygote stand-ins: read, and killed only while
each pid is still the process that was noted."""

import os
import signal
import subprocess
import sys

from elastic_train.agent import forked_workers
from elastic_train.agent.local_agent import surviving


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_the_noted_workers_of_the_given_stand_ins_are_read(tmp_path):
    directory = str(tmp_path / "pids")
    forked_workers.clear(directory)
    (tmp_path / "pids" / "100").write_text("4242 777")
    (tmp_path / "pids" / "101").write_text("garbled")
    (tmp_path / "pids" / "102.tmp").write_text("1 2")
    assert forked_workers.behind(directory, [100, 101, 103]) == {4242: "777"}
    forked_workers.clear(directory)
    assert os.listdir(directory) == []


def test_a_noted_worker_is_killed_and_a_reused_pid_is_not():
    worker, stranger = _sleeper(), _sleeper()
    try:
        started = forked_workers.start_time(worker.pid)
        assert started is not None
        forked_workers.kill({worker.pid: started, stranger.pid: "1"})  # 1: not its start
        assert worker.wait(10) == -signal.SIGKILL
        assert stranger.pid in surviving([stranger.pid], wait_s=0.2)
    finally:
        stranger.kill()
        stranger.wait()
    assert forked_workers.start_time(worker.pid) is None  # gone: nothing to kill
