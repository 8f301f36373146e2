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
import time

from elastic_train.storage import filesystem as fsutil
from elastic_train.worker.heartbeat import STACK_SIGNAL, progress_file, stack_file

logger = logging.getLogger(__name__)

STARTUP_ALLOWANCE_S = 120.0


def _where(stack: str) -> str:
    """The innermost frames of the dump's first thread, as the hang's signature."""
    frames = re.findall(r'File "([^"]+)", line (\d+) in (\S+)', stack)
    return " <- ".join(f"{os.path.basename(f)}:{line} {fn}" for f, line, fn in frames[:3])


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
        for rank in hung:
            pid, error_file = workers[rank]
            stack = self._read_stack(rank)
            where = _where(stack)
            repeat = where and self._previous.get(rank) == where
            self._previous[rank] = where
            message = (f"HangError: rank {rank} made no progress (no report() or batch) for "
                       f"{stale[rank]:.0f}s, over the hang timeout of {self.timeout_s:.0f}s"
                       + (f"; stuck at {where}" if where else "")
                       + ("; it hung at the same place in the previous attempt" if repeat
                          else ""))
            logger.warning("%s; stopping it.", message)
            data = {"message": {"message": message, "extraInfo": {
                "py_callstack": stack or "(no Python stack could be taken)",
                "timestamp": str(int(now))}}}
            fsutil.write_local_atomic(error_file, json.dumps(data).encode())
            self._signal(pid, signal.SIGKILL)
        return hung

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
