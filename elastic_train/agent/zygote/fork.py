"""The zygote forked from the driver itself, when the driver has imported torch already.

A zygote started as a new interpreter imports torch again: seconds of CPU on
the cold start's critical path, after the driver's own ``import torch``.
Forking the driver instead costs milliseconds and shares its pages, but only
a process that is safe to fork can be forked: one thread (a fork keeps only
the calling thread, and locks other threads hold stay locked for ever), no
CUDA context (CUDA does not survive a fork), no fork poison (a process that
only asked for its CUDA devices has none, yet its children cannot use CUDA) and
no OpenMP pool that already ran (a child of such a process hangs at its first
parallel operation). :func:`reason_not_to_fork` says
why not, and :class:`~elastic_train.agent.zygote.Zygote` then starts a new
interpreter as before.

The forked process then sheds what it inherited from the driver, so that the
workers it forks look like fresh processes: a new session, every inherited
descriptor but the standard streams pointed at ``/dev/null`` (not closed: a
stale Python object closing its old descriptor number must not close a new
file of the worker's), the standard streams on descriptors 0-2, default signal
handlers (SIGINT and SIGTERM ignored from the fork on: a Ctrl-C to the terminal's
group is the driver's, see :func:`~elastic_train._internal.forked_call.hold_stops`),
the interpreter's own error hooks, no ``atexit`` handlers, no logging
handlers, and none of the user's own modules (each worker imports them again, in its
own environment; each worker reseeds torch's generator as a new process does).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable

from elastic_train._internal.forked_call import hold_stops, release_stops
from elastic_train.worker import user_code


def reason_not_to_fork() -> str | None:
    """Why this process cannot be the zygote's parent by fork, or None if it can."""
    if not sys.platform.startswith("linux"):
        return "not Linux"
    if "torch" not in sys.modules:
        return "torch is not imported here: nothing to share"
    if threading.active_count() != 1:
        return "this process runs Python threads"
    torch = sys.modules["torch"]
    if torch.cuda.is_initialized():
        return "this process initialised CUDA"
    return _fork_trial()


_POISONED = 3  # a trial child's exit code: torch marked it a bad fork
_POISON = ("this process asked the CUDA (or XPU) runtime for its devices "
           "(torch.cuda.is_available(), device_count(), ...): torch poisons its forks")
_OPENMP = "this process ran parallel torch operations (OpenMP does not survive a fork)"


def poisoned_fork() -> bool:
    """In a forked child: whether torch marked this process a bad fork (its parent
    touched the CUDA or XPU runtime; the first device call here would fail)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    return any(getattr(getattr(torch, kind, None), "_is_in_bad_fork", lambda: False)()
               for kind in ("cuda", "xpu"))


def _fork_trial(timeout_s: float = 2.0) -> str | None:
    """Why a forked child of this process would not work as the zygote, tried in a
    throw-away child rather than guessed; None when it would.

    - torch's fork poison: a ``torch.cuda.is_available()`` or ``device_count()`` here
      leaves ``torch.cuda.is_initialized()`` False, but every process forked from this
      one -- the zygote and all its workers -- fails its first CUDA call.
    - Native thread pools: OpenBLAS's idle threads (started by ``import torch``) re-create
      themselves after a fork, but an OpenMP pool that already ran -- any parallel torch
      operation in this process -- leaves a child that hangs at its first parallel
      operation.
    """
    def trial() -> int:
        if poisoned_fork():
            return _POISONED
        torch = sys.modules["torch"]
        torch.set_num_threads(2)
        (torch.ones(1 << 20) * 2).sum()
        return 0

    code = exit_code_in_fork(trial, timeout_s)
    return None if code == 0 else _POISON if code == _POISONED else _OPENMP


def forks_are_poisoned(timeout_s: float = 10.0) -> bool:
    """Whether torch poisoned this process's forks (see :func:`poisoned_fork`)."""
    return exit_code_in_fork(lambda: _POISONED if poisoned_fork() else 0,
                             timeout_s) == _POISONED


def exit_code_in_fork(body: Callable[[], int], timeout_s: float) -> int | None:
    """Runs ``body`` in a forked child and returns its result as the child's exit code
    (1 if it raised); None if the child did not end within ``timeout_s`` (it is killed),
    or a SIGCHLD handler of this process reaped it first (its code is lost)."""
    mask = hold_stops()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            release_stops(mask, signal.SIG_IGN)  # the driver's Ctrl-C ends it (below)
            code = body()
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout_s
    try:
        release_stops(mask)  # a Ctrl-C that came meanwhile is raised here
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.005)
    except ChildProcessError:  # reaped by someone else's handler
        return None
    except BaseException:  # a Ctrl-C: a trial child that hangs must not outlive it
        _end(pid)
        raise
    _end(pid)  # out of time
    return None


def _end(pid: int) -> None:
    """SIGKILLs and reaps this process's child ``pid``, which nothing has reaped yet."""
    with contextlib.suppress(ChildProcessError, ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


class ForkedZygote:
    """The forked zygote, with the part of ``subprocess.Popen``'s interface the agent uses:
    ``pid``, ``stdin`` (closing it ends the zygote), ``poll``, ``wait``, ``kill``; and
    :meth:`wait_ready`."""

    def __init__(self, pid: int, stdin_fd: int, ready_fd: int):
        self.pid = pid
        self.stdin = os.fdopen(stdin_fd, "wb")
        self.returncode: int | None = None
        self._ready_fd = ready_fd

    def wait_ready(self, timeout: float) -> bool:
        """Waits until the zygote has shed the driver (milliseconds): False if it failed
        to (it then exits, its traceback beside its socket), True once it has, or after
        ``timeout``."""
        try:
            if not select.select([self._ready_fd], [], [], timeout)[0]:
                return True
            return os.read(self._ready_fd, 1) == b"1"
        finally:
            os.close(self._ready_fd)

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(ChildProcessError):
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"zygote {self.pid}", timeout or 0)
            time.sleep(0.01)
        return self.returncode  # type: ignore[return-value]

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


def fork(main: Callable[[str], None], path: str,
         user_roots: tuple[str, ...] = ()) -> ForkedZygote:
    """Forks a zygote that runs ``main(path)`` (see :func:`elastic_train.agent.zygote._main`).
    ``user_roots``: the directories of the user's own code (see :func:`_forget_user_modules`).
    A zygote that fails to shed the driver leaves its traceback beside ``path`` (see
    :func:`elastic_train.agent.zygote.note_error`) and exits; see
    :meth:`ForkedZygote.wait_ready`."""
    read_end, write_end = os.pipe()
    ready_r, ready_w = os.pipe()
    mask = hold_stops()
    pid = os.fork()
    if pid == 0:  # the zygote, and later each worker it forks, ends here
        code = 1
        try:
            try:
                release_stops(mask, signal.SIG_IGN)  # as the zygote has them (see _main)
                os.dup2(read_end, 0)
                _shed_the_driver(keep={0, 1, 2, ready_w}, user_roots=user_roots)
            except BaseException:
                from elastic_train.agent.zygote.server import note_error

                note_error(path)  # the driver shows it (its stderr is this one's)
                raise
            os.write(ready_w, b"1")
            os.close(ready_w)
            code = _run(main, path)
        finally:
            os._exit(code)
    os.close(read_end)
    os.close(ready_w)
    zygote = ForkedZygote(pid, write_end, ready_r)
    try:
        release_stops(mask)  # a Ctrl-C that came meanwhile is raised here
    except BaseException:
        zygote.stdin.close()  # no one will use it: it exits
        os.close(ready_r)
        _end(pid)
        raise
    return zygote


def _shed_the_driver(keep: set[int], user_roots: tuple[str, ...] = ()) -> None:
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep and fd != devnull:
            with contextlib.suppress(OSError):
                os.dup2(devnull, fd)
    os.close(devnull)
    _standard_streams()
    signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError, TypeError):
            if callable(signal.getsignal(sig)):
                signal.signal(sig, signal.SIG_DFL)
    atexit._clear()  # the driver's exit handlers are not the workers'
    _default_hooks()
    _forget_user_modules(user_roots)
    for logger in [logging.getLogger(), *[v for v in logging.Logger.manager.loggerDict.values()
                                          if isinstance(v, logging.Logger)]]:
        logger.handlers.clear()


def _forget_user_modules(user_roots: tuple[str, ...] = ()) -> None:
    """Drops the driver's imports of the user's own code: a worker imports them again, in
    its own environment (``RANK``...), as a fresh process would -- such modules may read
    it at import. What is the user's code, and what installed (kept, wherever it is
    installed: torch on ``PYTHONPATH`` too), :mod:`elastic_train.worker.user_code` decides,
    with ``user_roots`` added to this process's roots."""
    roots = user_code.user_roots(user_roots)
    for name, module in list(sys.modules.items()):
        if (module is not None and name not in ("__main__", "__mp_main__")
                and user_code.is_user_code(module, roots)):
            del sys.modules[name]


def _default_hooks() -> None:
    """The interpreter's own error hooks, as a new interpreter has them: the driver's (a
    notebook's, pytest's) would run in every worker, and one that keeps what it is given
    (pytest collects unraisable exceptions) keeps a failed attempt's frames -- a
    DataLoader iterator and its worker pipes -- alive across in-process restarts."""
    sys.excepthook = sys.__excepthook__
    sys.unraisablehook = sys.__unraisablehook__
    sys.displayhook = sys.__displayhook__
    threading.excepthook = threading.__excepthook__


def _standard_streams() -> None:
    """``sys.stdin``/``stdout``/``stderr`` on descriptors 0, 1 and 2 again, as a new
    interpreter has them: the driver may have replaced them (pytest's capture, a
    notebook's, a logging tee), and the zygote and its workers use the descriptors."""
    sys.stdin = sys.__stdin__ = open(0, closefd=False)  # noqa: SIM115 -- for the process
    sys.stdout = sys.__stdout__ = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = sys.__stderr__ = open(2, "w", closefd=False, errors="backslashreplace")  # noqa: SIM115


def _run(main: Callable[[str], None], path: str) -> int:
    """Runs ``main`` and ends as an interpreter would: non-daemon threads joined, ``atexit``
    handlers run, streams flushed; returns the exit code (a worker's ``sys.exit(N)`` too)."""
    try:
        main(path)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int) and exc.code is not None:
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 -- what an interpreter would print, then exit 1
        traceback.print_exc()
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    return code
