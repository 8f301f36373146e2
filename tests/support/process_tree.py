"""A process and all its descendants, read from /proc: what a scheduler signals when it
stops a job step (Slurm's scancel and preemption, systemd's stop: every process of the
job's cgroup at once, whatever its session or process group)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import IO


def _parents() -> dict[int, int]:
    """pid -> parent pid of every live (non-zombie) process."""
    parents = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parents[int(entry)] = int(fields[1])
    return parents


def child_pids(parent: int) -> list[int]:
    """Processes whose parent is ``parent``."""
    return [pid for pid, ppid in _parents().items() if ppid == parent]


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children first, then theirs)."""
    parents = _parents()
    found, frontier = [], [pid]
    while frontier:
        children = [p for p, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def command_line(pid: int) -> list[str]:
    """The process's argv, or [] once it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode() for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def thread_policies(pid: int) -> set[int]:
    """The scheduling policies (``os.SCHED_*``) of the process's threads."""
    policies = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that just ended
            policies.add(os.sched_getscheduler(int(tid)))
    return policies


def signal_tree(pid: int, sig: int) -> list[int]:
    """Sends ``sig`` to ``pid`` and to every descendant at once, as a scheduler stopping
    the whole job does; returns the pids signalled."""
    pids = [pid, *descendants(pid)]
    for target in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(target, sig)
    return pids


def stop_tree(pid: int) -> None:
    """SIGKILLs ``pid`` and every descendant (a test's clean-up)."""
    signal_tree(pid, signal.SIGKILL)


def stop_logged(procs: list[tuple[subprocess.Popen, IO[str]]]) -> None:
    """A test's clean-up of processes it started with a log file each: every one still
    running is SIGKILLed with its descendants and waited for; every log is closed."""
    for proc, log in procs:
        if proc.poll() is None:
            stop_tree(proc.pid)
            proc.wait()
        log.close()
