"""Which process a pid names, across pid reuse: its start time and this boot's identity.

A pid alone does not name a process for long: once it ends, the kernel may give its
pid to the next one. The process's start time (clock ticks since boot, field 22 of
``/proc/<pid>/stat``) with the boot's id tells them apart. Linux only; elsewhere a
process is never recognised (``start_ticks`` is empty).
"""

from __future__ import annotations

import contextlib
import os


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
