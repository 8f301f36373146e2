"""Which process a pid names, across pid reuse: its start time and this boot's identity;
and which processes a child started, ended with it.

A pid alone does not name a process for long: once it ends, the kernel may give its
pid to the next one. The process's start time (clock ticks since boot, field 22 of
``/proc/<pid>/stat``) with the boot's id tells them apart. Linux only; elsewhere a
process is never recognised (``start_ticks`` is empty).

A child of ours keeps its pid until we reap it, and so does the session it leads
(the kernel gives no process a pid still in use as a session's id):
:func:`has_exited` asks without reaping, so that :func:`end_tree` can still name the
child's processes by its pid after it has exited -- the processes a user's function
left behind it (a validation's, a health-check command's), which must not outlive
the work they were started for.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable


def read_text(path: str) -> str:
    """The stripped text of a small file; empty when it cannot be read."""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def start_ticks(pid: int) -> str:
    """The process's start time (clock ticks since boot); empty when there is no such
    process (or no ``/proc``)."""
    stat = read_text(f"/proc/{pid}/stat")
    return stat.rsplit(")", 1)[1].split()[19] if ")" in stat else ""


def boot_id() -> str:
    return read_text("/proc/sys/kernel/random/boot_id")


def pid_namespace() -> str:
    """This process's pid namespace (``pid:[4026531836]``): pids mean the same only in it."""
    with contextlib.suppress(OSError):
        return os.readlink("/proc/self/ns/pid")
    return ""


def is_running(pid: int, ticks: str) -> bool:
    """Whether the process ``pid`` that started at ``ticks`` still runs (in this boot and
    pid namespace: the caller checks that)."""
    return bool(ticks) and start_ticks(pid) == ticks


def has_exited(pid: int) -> bool:
    """Whether this process's child ``pid`` has exited, leaving it unreaped (its pid
    stays its own until ``Popen.wait()`` reaps it)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, session id) of every live (non-zombie) process."""
    found = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        fields = read_text(f"/proc/{entry}/stat").rsplit(")", 1)[-1].split()
        if len(fields) > 3 and fields[0] not in ("Z", "X"):
            found[int(entry)] = (int(fields[1]), int(fields[3]))
    return found


def started_by(pid: int) -> set[int]:
    """The live processes below ``pid``, and those left in the session it leads (a
    child started with ``start_new_session``) once their parents ended."""
    processes = _processes()
    tree: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {p for p, (parent, _) in processes.items() if parent in frontier} - tree
        tree |= frontier
    return tree | {p for p, (_, session) in processes.items() if session == pid} - {pid}


def _send(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def end_started(pid: int) -> None:
    """SIGKILLs every process ``pid`` started (:func:`started_by`), whatever their process
    group or session; ``pid`` itself, and this process, are left. Each one found is
    stopped first (SIGSTOP), so that none starts another or leaves the tree while the
    rest are looked for; then they are killed together."""
    stopped: set[int] = set()
    while new := started_by(pid) - stopped - {os.getpid()}:
        _send(new, signal.SIGSTOP)
        stopped |= new
    _send(stopped, signal.SIGKILL)


def end_tree(pid: int) -> None:
    """SIGKILLs ``pid`` -- this process, or a child not yet reaped -- with every process
    it started (:func:`end_started`); another process than this one is stopped first."""
    if pid != os.getpid():
        _send([pid], signal.SIGSTOP)
    end_started(pid)
    _send([pid], signal.SIGKILL)
