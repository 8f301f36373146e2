"""Preemption notices: a SIGTERM is a warning that the node will go, not a crash.

Schedulers and spot reclaims send SIGTERM some seconds before they kill a
node (Slurm and systemd to every process, Kubernetes to the container's
first process, which is the agent; the agent passes it on to its workers).
A worker that has a session catches it, notes the time and keeps training;
the next collective session call -- ``report()`` or
:func:`elastic_train.get_preemption_info` -- tells every rank, so the ranks
can save a just-in-time checkpoint together before the deadline
(``FailureConfig.preemption_grace_s`` after the signal). A ``report()`` with a
checkpoint made while a notice is out is committed before it returns.

SIGTERMs within the grace period are one notice: when the scheduler signals
every process of the node, a worker gets the scheduler's SIGTERM and the one
its agent passes on. A SIGTERM after the grace stops the worker at once.

Each rank that learns of a notice leaves a file in the agent's notice
directory: when the group then dies (the node was reclaimed), the agent
charges the restart to ``FailureConfig.max_preemption_failures``, not to
``max_failures``.

Example::

    def train_func():
        for step in range(start, steps):
            ...
            if elastic_train.get_preemption_info() is not None:
                elastic_train.report(metrics, checkpoint=save(step))  # committed now
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from dataclasses import dataclass

from elastic_train._internal import env_vars

_noticed_at: float | None = None


@dataclass(frozen=True)
class PreemptionInfo:
    """An imminent preemption, as every rank agrees on it.

    Attributes:
        ranks: The world ranks that received the notice (their node is going).
        hostnames: The hosts of those ranks.
        deadline: ``time.time()`` by which the notified ranks will be stopped.
    """

    ranks: tuple[int, ...]
    hostnames: tuple[str, ...]
    deadline: float


def grace_s() -> float:
    """Seconds between the notice and the kill, as the agent was configured."""
    return env_vars.AgentFacts.from_environ().preemption_grace_s


def _on_sigterm(signum: int, frame: object) -> None:
    global _noticed_at
    now = time.time()
    if _noticed_at is None:
        _noticed_at = now
    elif now >= _noticed_at + grace_s():  # a SIGTERM after the grace: stop now, as without
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a handler
        os.kill(os.getpid(), signal.SIGTERM)


def install() -> None:
    """Turns SIGTERM into a preemption notice in this (worker) process; called by each
    attempt's session. A notice whose grace is over is forgotten: after an in-process
    restart it would be announced at every report again (every checkpoint synchronous,
    every failure charged to preemption) and a new SIGTERM taken for a second one (a
    kill). One still within its grace stays: the node is still going."""
    global _noticed_at
    if _noticed_at is not None and time.time() >= _noticed_at + grace_s():
        _noticed_at = None
    signal.signal(signal.SIGTERM, _on_sigterm)


def local_notice() -> tuple[int, str, float] | None:
    """``(pid, host, time)`` of the SIGTERM this process got, if any."""
    if _noticed_at is None:
        return None
    return os.getpid(), socket.gethostname(), _noticed_at


def agree(notices: list[tuple[int, str, float] | None]) -> PreemptionInfo | None:
    """Every rank's :func:`local_notice` (indexed by rank) -> the shared notice, or None."""
    seen = [(rank, n) for rank, n in enumerate(notices) if n is not None]
    if not seen:
        return None
    return PreemptionInfo(ranks=tuple(r for r, _ in seen),
                          hostnames=tuple(sorted({n[1] for _, n in seen})),
                          deadline=min(n[2] for _, n in seen) + grace_s())


def leave_mark(rank: int) -> None:
    """Tells this node's agent that the group knew of a preemption (see module doc)."""
    notice_dir = env_vars.AgentFacts.from_environ().preemption_dir
    if notice_dir:
        with open(os.path.join(notice_dir, f"rank{rank}"), "w") as f:
            f.write(str(time.time()))


def marked(notice_dir: str) -> bool:
    """Whether any worker of this node left a mark since :func:`clear`."""
    return os.path.isdir(notice_dir) and bool(os.listdir(notice_dir))


def clear(notice_dir: str) -> None:
    """Forgets the marks of the previous incarnation of the group. Agents of one host
    that share the run's log directory (local storage) clear it at the same time, so a
    mark already gone is not an error."""
    os.makedirs(notice_dir, exist_ok=True)
    for name in os.listdir(notice_dir):
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(notice_dir, name))
