"""Hang detection: a worker that stops making progress is stopped like a crashed one.

Workers touch a progress file as they report and take batches (see
:mod:`elastic_train.worker.heartbeat`). When a local worker's file is older than the
hang timeout, the agent asks every stale worker for its Python stack (SIGUSR1,
``faulthandler``), writes a ``HangError`` with that stack into the worker's
error file -- so the driver reports it with the rank, like any failure -- and
SIGKILLs it; the agent then restarts the group within the failure budget. A
hang whose stack matches the previous hang of that rank is reported as a
repeat, which points at a deterministic deadlock rather than a passing stall.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import sysconfig
import time
from dataclasses import dataclass

from elastic_train.storage import filesystem as fsutil
from elastic_train.worker.heartbeat import STACK_SIGNAL, progress_file, stack_file

logger = logging.getLogger(__name__)

STARTUP_ALLOWANCE_S = 120.0
# In a hung worker's error file: it was waiting in a collective for another rank (so it is
# no cause of the hang: :mod:`.failures` ranks it after the rank that stopped).
WAITED_FOR_PEER = "waited_for_peer"
# In every hung worker's error file: the watch stopped it (its SIGKILL is no crash of its own).
HUNG = "hung"
_FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')
_THREAD = re.compile(r"^(?:Current thread|Thread) 0x", re.MULTILINE)
_COLLECTIVES = f"{os.sep}torch{os.sep}distributed{os.sep}"  # torch's collectives and stores
# Where library code lives: the standard library, installed packages, this package.
_LIBRARIES = tuple({path.rstrip(os.sep) + os.sep for path in (
    *(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")),
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))))})


@dataclass(frozen=True)
class Stuck:
    """Where a hung worker's main thread is (``where``: its innermost frame, and the
    user's frame that led there), and whether it is waiting in a collective for another
    rank (a frame of ``torch.distributed``) rather than stuck by itself."""

    where: str
    waiting: bool

    @classmethod
    def of(cls, stack: str) -> Stuck:
        """From a ``faulthandler`` dump of every thread: the main thread's frames."""
        threads = [frames for _, frames in _threads(stack)]
        if not threads:
            return cls("", False)
        main = threads[0]
        inner = _frame(main[0])
        user = next((f for f in main if not f[0].startswith(_LIBRARIES + ("<",))), None)
        where = inner if user is None or user == main[0] else f"{inner}, called from {_frame(user)}"
        return cls(where, any(_COLLECTIVES in f[0] for f in main))


def _threads(stack: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """A ``faulthandler`` dump of every thread, as (text, frames) per thread, the main
    thread first: the one not started by ``threading`` -- the train function's; the
    others are the project's upload and heartbeat threads, idle by design."""
    starts = [m.start() for m in _THREAD.finditer(stack)] or [0]
    parts = [stack[a:b] for a, b in zip(starts, [*starts[1:], len(stack)], strict=True)]
    threads = [(part, _FRAME.findall(part)) for part in parts]
    threads = [(part, frames) for part, frames in threads if frames]
    main = next((i for i, (_, frames) in enumerate(threads)
                 if os.path.basename(frames[-1][0]) != "threading.py"), 0)
    return threads[main:main + 1] + threads[:main] + threads[main + 1:]


def main_thread_first(stack: str) -> str:
    """The dump with the train function's thread first (faulthandler lists the newest
    thread first: the project's own upload thread), for a reader to see the hang first."""
    threads = _threads(stack)
    if not threads:
        return stack
    return "\n\n".join(part.strip("\n") for part, _ in threads) + "\n"


def _frame(frame: tuple[str, str, str]) -> str:
    path, line, function = frame
    return f"{os.path.basename(path)}:{line} {function}"


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


class HangWatch:
    """Checks the local workers' progress; stops the stale ones."""

    def __init__(self, progress_dir: str, timeout_s: float):
        self.progress_dir = progress_dir
        self.timeout_s = timeout_s
        self._started = time.time()
        self._previous: dict[int, str] = {}

    def reset(self, ranks: list[int]) -> None:
        """Before a worker group starts: forget the previous group's progress. A stack file
        is emptied in place, not removed: after an in-process restart the worker still
        has it open (for appending) and writes its next dump there."""
        os.makedirs(self.progress_dir, exist_ok=True)
        for rank in ranks:
            with contextlib.suppress(FileNotFoundError):
                os.remove(progress_file(self.progress_dir, rank))
            with contextlib.suppress(FileNotFoundError):
                os.truncate(stack_file(self.progress_dir, rank), 0)
        self._started = time.time()

    def _idle(self, rank: int, now: float) -> float:
        """Seconds since the rank's last beat, less a start-up allowance before its first
        (interpreter and torch imports come before a worker can beat, or dump its stack)."""
        try:
            return now - os.path.getmtime(progress_file(self.progress_dir, rank))
        except OSError:
            return now - self._started - STARTUP_ALLOWANCE_S

    def check(self, workers: dict[int, tuple[int, str]]) -> list[int]:
        """``workers``: rank -> (pid, error file). Stops the hung ones; returns their ranks."""
        now = time.time()
        stale = {rank: self._idle(rank, now) for rank in workers}
        hung = [rank for rank, idle in stale.items() if idle > self.timeout_s]
        if not hung:
            return []
        for rank in hung:
            self._signal(workers[rank][0], STACK_SIGNAL)
        time.sleep(0.5)  # let faulthandler write
        stacks = {rank: self._read_stack(rank) for rank in hung}
        stuck = {rank: Stuck.of(stacks[rank]) for rank in hung}
        stopped = [rank for rank in hung if not stuck[rank].waiting]
        waiters = [rank for rank in hung if stuck[rank].waiting]
        for rank in stopped + waiters:  # the cause first, in the log too
            pid, error_file = workers[rank]
            message = self._message(rank, stale[rank], stuck[rank], stopped, waiters)
            logger.warning("%s; stopping it.", message)
            stack = main_thread_first(stacks[rank]) or "(no Python stack could be taken)\n"
            data = {"message": {"message": message, "extraInfo": {
                "py_callstack": stack + message, HUNG: True,
                WAITED_FOR_PEER: stuck[rank].waiting,
                "timestamp": str(int(now))}}}
            fsutil.write_local_atomic(error_file, json.dumps(data).encode())
            self._signal(pid, signal.SIGKILL)
        return hung

    def _message(self, rank: int, idle: float, stuck: Stuck, stopped: list[int],
                 waiters: list[int]) -> str:
        """The HangError of ``rank``: the rank that stopped reporting is named as the
        cause, with the ranks that waited for it; a waiter says whom it waited for."""
        repeat = stuck.where and self._previous.get(rank) == stuck.where
        self._previous[rank] = stuck.where
        if stuck.waiting:
            whom = _ranks(stopped) if stopped else "another rank"
            what = (f"rank {rank} made no progress for {idle:.0f}s: it waited in a collective "
                    f"for {whom}, which stopped reporting")
        else:
            others = (f"; {_ranks(waiters)} waited for it in a collective" if waiters else "")
            what = (f"rank {rank} made no progress (no report() or batch) for {idle:.0f}s, "
                    f"over the hang timeout of {self.timeout_s:.0f}s{others}")
        return (f"HangError: {what}" + (f"; stuck at {stuck.where}" if stuck.where else "")
                + ("; it hung at the same place in the previous attempt" if repeat else ""))

    def _read_stack(self, rank: int) -> str:
        try:
            with open(stack_file(self.progress_dir, rank)) as f:
                return f.read()
        except OSError:
            return ""

    @staticmethod
    def _signal(pid: int, sig: int) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
