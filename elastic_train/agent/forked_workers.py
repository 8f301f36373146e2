"""The workers a zygote forked for this agent's group, stopped and waited for by the agent.

torch's agent starts, watches and stops the zygote's stand-ins
(:mod:`.zygote.client`), not the workers behind them: when a stand-in is
SIGKILLed, the zygote kills its worker a moment later, on its own time. A
restart must not start the next group while the old one still holds ports,
memory or GPUs, and a worker that survives SIGKILL must be reported, so each
stand-in notes its worker's pid and start time (which tells the worker from a
later process given the same pid) in a directory of the agent's, and the agent
kills those workers itself and waits for them as for its own children.

Example::

    workers = behind(directory, stand_in_pids)   # before the stand-ins are stopped
    ...                                          # torch stops the stand-ins
    kill(workers)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Iterable, Mapping


def start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[19] if fields[0] not in ("Z", "X") else None


def clear(directory: str) -> None:
    """Forgets the workers of the previous group (called before a group starts)."""
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory, exist_ok=True)


def behind(directory: str, stand_ins: Iterable[int]) -> dict[int, str]:
    """The workers behind ``stand_ins`` (pids) that their stand-ins noted: pid -> start time."""
    workers = {}
    for stand_in in stand_ins:
        try:
            with open(os.path.join(directory, str(stand_in))) as f:
                pid, started = f.read().split()
        except (OSError, ValueError):
            continue  # not a stand-in, or its worker was never forked
        workers[int(pid)] = started
    return workers


def kill(workers: Mapping[int, str]) -> None:
    """SIGKILLs each worker that is still the process that was noted (same start time)."""
    for pid, started in workers.items():
        if start_time(pid) == started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
