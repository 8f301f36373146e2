"""Unit tests: which ranks the agent declares hung, and what it records about them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import time

import elastic_train
from elastic_train._internal import env_vars
from elastic_train.agent.hang_watch import HangWatch, Stuck, main_thread_first
from elastic_train.worker.heartbeat import progress_file
from tests.conftest import pid_alive, wait_until


def test_stale_rank_is_recorded_and_killed_fresh_and_starting_ranks_are_not(tmp_path):
    watch = HangWatch(str(tmp_path / "progress"), timeout_s=5)
    watch.reset([0, 1, 2])
    stale = progress_file(watch.progress_dir, 0)
    open(stale, "w").close()
    os.utime(stale, (time.time() - 60, time.time() - 60))
    open(progress_file(watch.progress_dir, 1), "w").close()  # just beat
    # rank 2 has not beaten yet: still within the start-up allowance
    procs = [subprocess.Popen(["sleep", "30"]) for _ in range(3)]
    try:
        errors = [str(tmp_path / f"error{r}.json") for r in range(3)]
        hung = watch.check({r: (p.pid, errors[r]) for r, p in enumerate(procs)})
        assert hung == [0]
        with open(errors[0]) as f:
            message = json.load(f)["message"]["message"]
        assert message.startswith("HangError: rank 0 made no progress")
        assert "over the hang timeout of 5s" in message
        assert wait_until(lambda: procs[0].poll() is not None, 5)
        assert pid_alive(procs[1].pid) and pid_alive(procs[2].pid)
        assert not os.path.exists(errors[1]) and not os.path.exists(errors[2])
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_reset_forgets_the_previous_groups_progress(tmp_path):
    watch = HangWatch(str(tmp_path / "progress"), timeout_s=5)
    watch.reset([0])
    path = progress_file(watch.progress_dir, 0)
    open(path, "w").close()
    os.utime(path, (0, 0))
    watch.reset([0])
    assert not os.path.exists(path)
    assert watch.check({0: (2**22 + 7, str(tmp_path / "e"))}) == []


WORKER = """
import os, sys, time
from elastic_train.worker import heartbeat
heartbeat.arm()
open(sys.argv[1], "w").close()
def stuck_in_collective():
    while True:
        time.sleep(0.05)
stuck_in_collective()
"""


def test_a_worker_that_survives_a_restart_still_gives_its_stack(tmp_path):
    """#24, item 6: an in-process restart resets the watch while the worker lives on with
    the stack file it opened at start; its next hang still reports where it is stuck, and
    a repeat at the same place is still seen."""
    watch = HangWatch(str(tmp_path / "progress"), timeout_s=5)
    watch.reset([0])
    ready = tmp_path / "ready"
    env = {**os.environ, env_vars.PROGRESS_DIR: watch.progress_dir, "RANK": "0"}
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(ready)], env=env)
    try:
        assert wait_until(ready.exists, 60)
        watch.reset([0])  # the in-process restart: the worker keeps its stack file open
        stale = progress_file(watch.progress_dir, 0)
        open(stale, "w").close()
        os.utime(stale, (time.time() - 60, time.time() - 60))
        error = str(tmp_path / "error.json")
        assert watch.check({0: (worker.pid, error)}) == [0]
        with open(error) as f:
            info = json.load(f)["message"]
        assert "stuck_in_collective" in info["extraInfo"]["py_callstack"]
        assert "stuck at " in info["message"]
    finally:
        worker.kill()
        worker.wait()



TORCH_FRAME = '  File "{site}/torch/distributed/distributed_c10d.py", line 3913 in all_reduce\n'
DUMP = """Thread 0x00007f4b2ffff6c0 (most recent call first):
  File "{lib}/threading.py", line 327 in wait
  File "{lib}/queue.py", line 171 in get
  File "{pkg}/storage/uploader.py", line 253 in _run
  File "{lib}/threading.py", line 1002 in _bootstrap

Current thread 0x00007f4c0cbfab80 (most recent call first):
{torch}  File "{pkg}/worker/session.py", line 262 in report
  File "/home/me/train.py", line 10 in train
  File "{pkg}/worker/run_spec.py", line 66 in call_train_function
  File "/home/me/train.py", line 16 in <module>
"""


def dump(in_collective: bool) -> str:
    paths = {"lib": sysconfig.get_paths()["stdlib"], "site": sysconfig.get_paths()["purelib"],
             "pkg": os.path.dirname(elastic_train.__file__)}
    return DUMP.format(torch=TORCH_FRAME.format(**paths) if in_collective else "", **paths)


def test_the_main_threads_frame_is_reported_not_the_first_threads():
    """faulthandler lists the idle upload thread first; the hang is the main thread's, and
    a rank in a collective of torch's is waiting for another rank."""
    assert Stuck.of(dump(in_collective=True)) == Stuck(
        "distributed_c10d.py:3913 all_reduce, called from train.py:10 train", waiting=True)
    assert Stuck.of(dump(in_collective=False)) == Stuck(
        "session.py:262 report, called from train.py:10 train", waiting=False)
    assert Stuck.of("") == Stuck("", False)


def test_the_main_threads_stack_is_put_first():
    """The recorded stack leads with the train function's thread, every thread kept."""
    ordered = main_thread_first(dump(in_collective=False))
    assert ordered.startswith("Current thread 0x00007f4c0cbfab80"), ordered
    assert ordered.count("Thread 0x00007f4b2ffff6c0") == 1 and ordered.endswith("_bootstrap\n")
    assert main_thread_first("") == ""
