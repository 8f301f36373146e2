"""Shared fixtures: a fresh storage directory, the deterministic job, and a leak check."""

from __future__ import annotations

import os
import signal
import time

import cloudpickle
import pytest

from tests import jobs

cloudpickle.register_pickle_by_value(jobs)


def child_pids(parent: int) -> list[int]:
    """Processes whose parent is ``parent`` (from /proc)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent and fields[0] != "Z":
            pids.append(int(entry))
    return pids


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_until(condition, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


@pytest.fixture
def storage_path(tmp_path):
    return str(tmp_path / "results")


@pytest.fixture
def no_leaked_processes():
    """Fails the test if it leaves a child process behind; kills such children."""
    before = set(child_pids(os.getpid()))
    yield
    leaked = [p for p in child_pids(os.getpid()) if p not in before]
    if leaked and wait_until(lambda: not [p for p in leaked if pid_alive(p)], 10):
        return
    for pid in leaked:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not leaked, f"processes left behind: {leaked}"
