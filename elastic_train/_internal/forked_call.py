"""Calling a function in a short-lived forked child, so that what it touches stays there.

The driver and the agent are what the worker zygote is forked from, so they must
never touch the CUDA runtime or NVML (see :mod:`elastic_train._internal.devices`), nor run
the user's code (a health check may import anything). A forked child may: it
answers through a pipe and exits, and the parent is as it was. A fork is used,
not a new interpreter, because a fork costs milliseconds where ``import torch``
costs seconds, and the child already holds the parent's imports.

A Ctrl-C (SIGINT to the terminal's whole process group) or a scheduler's SIGTERM that
comes while a child of the driver is being forked belongs to the driver, never to the
child: :func:`hold_stops` blocks both across the fork, the child gives them its own
disposition (ignored here: the parent ends the child) before :func:`release_stops`, and
the parent gets a stop that came meanwhile as soon as it releases them.

Example::

    from elastic_train._internal.forked_call import call_in_child
    answer = call_in_child(lambda: 6 * 7, timeout_s=10)
    answer.value if answer.ok else answer.error   # 42, or why not
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

STOPS = (signal.SIGINT, signal.SIGTERM)


@dataclass(frozen=True)
class Answer:
    """What the child answered: ``value`` when ``ok``; else ``error``, one line (the
    child's exception, or that it died or ran out of time)."""

    ok: bool
    value: Any = None
    error: str = ""


def call_in_child(fn: Callable[[], Any], timeout_s: float) -> Answer:
    """``fn()`` in a forked child that is SIGKILLed after ``timeout_s``; its return value
    must pickle."""
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    mask = hold_stops()
    pid = os.fork()
    if pid == 0:  # pragma: no cover -- the child
        code = 1
        try:
            release_stops(mask, signal.SIG_IGN)
            os.close(read_end)
            try:
                _one_thread()
                answer = Answer(True, fn())
            except BaseException as exc:  # noqa: BLE001 -- it is the answer
                last = traceback.extract_tb(exc.__traceback__)[-1:]
                where = f" (at {last[0].filename}:{last[0].lineno})" if last else ""
                answer = Answer(False, error=f"{type(exc).__name__}: {exc}{where}")
            data = pickle.dumps(answer)
            while data:
                data = data[os.write(write_end, data):]
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        release_stops(mask)  # a Ctrl-C that came meanwhile is raised here
        data, complete = _read_until_closed(read_end, time.monotonic() + timeout_s)
    finally:
        os.close(read_end)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # out of time (or done: then already gone)
        _, status = os.waitpid(pid, 0)
    if not complete:
        return Answer(False, error=f"no answer within {timeout_s:g}s")
    try:
        return pickle.loads(data)
    except Exception:  # noqa: BLE001 -- nothing, or half an answer: it died writing
        return Answer(False, error=f"the child died ({_status(status)})")


def hold_stops() -> set[signal.Signals]:
    """Blocks SIGINT and SIGTERM, before a fork; returns the mask that was (see
    :func:`release_stops`)."""
    return signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)


def release_stops(mask: set[signal.Signals] | None = None,
                  disposition: Any = None) -> None:
    """Ends :func:`hold_stops`: ``mask`` is set again (None: SIGINT and SIGTERM are
    unblocked). In a forked child, ``disposition`` (``signal.SIG_IGN``, ``SIG_DFL`` or a
    handler) is given to both first, so that a stop that came since the fork meets the
    child's disposition, not the parent's handler (a KeyboardInterrupt in the child's
    set-up) nor the zygote's ``SIG_IGN`` (a stop dropped). A stop that came meanwhile
    is delivered on return: in the parent, its handler raises here."""
    if disposition is not None:
        for sig in STOPS:
            signal.signal(sig, disposition)
    if mask is None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
    else:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _one_thread() -> None:
    """torch computes on one thread in the child: OpenMP's thread pool does not survive
    a fork, so a parallel region would wait for ever for threads the parent had (a CPU
    matmul in a child of a process that had trained hung so)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


def _read_until_closed(fd: int, deadline: float) -> tuple[bytes, bool]:
    """Everything written to ``fd`` until its writer closed it, and whether it did in time."""
    chunks = []
    while True:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(left, 0.0))
        if not ready:
            return b"".join(chunks), False
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks), True
        chunks.append(chunk)


def _status(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"
