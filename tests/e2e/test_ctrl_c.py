"""One Ctrl-C at any moment of a ``fit()``'s start-up ends the job at once, as interrupted,
and leaves no process: SIGINT to the terminal's whole process group (the driver and
whatever it forked that is still in its session) at the moments where a process is
being forked (see ``tests/e2e/scripts/ctrl_c_driver.py``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from elastic_train.agent import forked_workers
from tests.conftest import wait_until
from tests.support.paths import REPO
from tests.support.process_tree import descendants, stop_tree

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

GRACE_S = 20.0  # the workers' grace: what a worker deaf to the Ctrl-C would cost
PROMPT_S = 5.0  # the goal is 2 s; the rest is this machine's load


def _interrupted_driver(storage: str, moment: str, log) -> tuple[int, float, dict[int, str]]:
    """Runs the driver until it ends after its Ctrl-C at ``moment``: its exit code, the
    seconds from the Ctrl-C to its end (None: it sent none), and every process seen below
    it meanwhile (pid -> start time: a pid used again by another process is not it)."""
    driver = subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.scripts.ctrl_c_driver", storage, "c", moment,
         str(GRACE_S)], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)
    marker = os.path.join(storage, "ctrl-c-sent")
    seen: dict[int, str] = {}
    sent = None
    deadline = time.monotonic() + 60 + GRACE_S
    try:
        while driver.poll() is None and time.monotonic() < deadline:
            seen.update((pid, started) for pid in descendants(driver.pid)
                        if (started := forked_workers.start_time(pid)) is not None)
            if sent is None and os.path.exists(marker):
                sent = time.monotonic()
            time.sleep(0.02)
        took = None if sent is None else time.monotonic() - sent
    finally:
        if driver.poll() is None:
            stop_tree(driver.pid)
            driver.wait()
    return driver.returncode, took, seen


@pytest.mark.parametrize("moment", ["worker", "start", "zygote", "fork-trial"])
def test_one_ctrl_c_while_processes_are_forked_ends_the_job_at_once(tmp_path, moment):
    """``worker``: a worker the zygote just forked, still with the zygote's dispositions,
    is passed the agent's SIGINT (the zygote ignores it: it was dropped, and the driver
    waited out the grace); ``zygote`` and ``fork-trial``: a child of the driver, still in
    the terminal's group, gets the Ctrl-C too (a KeyboardInterrupt in its set-up);
    ``start``: the driver's agent before its workers run (a bare KeyboardInterrupt, which
    skipped the agent's shutdown and recorded the run as failed)."""
    storage = str(tmp_path / "results")
    with open(tmp_path / "driver.log", "w") as log:
        code, took, seen = _interrupted_driver(storage, moment, log)
    out = (tmp_path / "driver.log").read_text()
    try:
        assert took is not None, f"no Ctrl-C sent:\n{out}"
        assert code == -signal.SIGINT, out  # 130 in a shell
        assert took < PROMPT_S, f"{took:.1f}s after the Ctrl-C:\n{out}"
        assert not [line for line in out.splitlines() if line.startswith("[rank")
                    and "KeyboardInterrupt" in line], out
        run_json = os.path.join(storage, "c", "run.json")
        if os.path.exists(run_json):  # begun at the first rendezvous
            with open(run_json) as f:
                assert json.load(f)["status"] == "interrupted", out
        assert wait_until(lambda: not _alive(seen), 10), f"left behind: {_alive(seen)}\n{out}"
    finally:
        forked_workers.kill(seen)


def _alive(processes: dict[int, str]) -> list[int]:
    return [pid for pid, started in processes.items()
            if forked_workers.start_time(pid) == started]
