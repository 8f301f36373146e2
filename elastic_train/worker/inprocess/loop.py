"""In-process restarts, the worker's side: run the train function again in the same process.

With ``FailureConfig(restart_in_process=True)`` (the default for ``fit()``, and
for ``launch`` scripts whose main function is wrapped by
:func:`elastic_train.restart_in_process`), a worker runs its attempts in a loop
(:func:`run_attempts`) instead of running the train function once:

1. It waits until its agent lets the attempt start (``go.json``, see
   :mod:`.channel`), says it is ``running`` and calls the attempt. When
   a node was lost or joined meanwhile, the go gives it its place in the new
   world (rank, world size, store): the attempt forms the new group.
2. When the train function raises, the worker cuts its process groups'
   connections and tears the groups down at once (:mod:`.group_sockets`) -- a
   peer blocked in a collective with it gets an error instead of waiting for
   the collective's timeout -- and reports the error (``failed``).
3. When another rank failed, the agent sends :data:`~.channel.ABORT_SIGNAL`;
   the signal handler raises :class:`RestartAttempt` in the main thread, which
   unwinds the train function like any exception (``finally`` blocks and
   context managers run). A worker blocked in a collective with a peer that
   died or left gets the collective's error instead.
4. Either way it releases what the attempt held -- process groups, the
   session and its uploads, and, through a garbage collection, the train
   function's objects (a DataLoader's worker processes stop when its iterator
   goes) -- checks its device, and waits as ``ready`` for the next attempt. A
   worker with a checkpoint upload in flight first waits for the agent's verdict
   (:class:`~.channel.Verdict`): it finishes the upload when every
   process of the attempt lives, drops it when one died (as if its own process
   had), and when no restart is left, finishes it and reports ``stopped``.

The agent kills and replaces a worker that does not become ready within
``FailureConfig.unwind_timeout_s`` (a hang with the GIL held, a wedged C++
call, a handler that swallowed :class:`RestartAttempt`) or reports itself
``unhealthy`` (a sticky CUDA error).
"""

from __future__ import annotations

import gc
import logging
import math
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from elastic_train._internal import env_vars
from elastic_train.errors import ConfigError
from elastic_train.worker.inprocess import channel, group_sockets
from elastic_train.worker.inprocess.channel import FailureNote, Stage, WorkerRecord
from elastic_train.worker.lifecycle import collective_line, from_communication
from elastic_train.worker.live import held
from elastic_train.worker.session import uploads_in_flight

logger = logging.getLogger(__name__)
T = TypeVar("T")

class RestartAttempt(BaseException):
    """Raised in a worker's main thread when its agent ends the attempt (a rank failed).

    A ``BaseException``, like ``KeyboardInterrupt``: ``except Exception`` in the
    train function lets it through. A handler that swallows it keeps the worker
    in the failed attempt until the agent kills it (``unwind_timeout_s``).
    """


_in_attempt = False
_deferring = False  # between hold_aborts() and release_aborts(): an abort waits
_deferred = False  # an abort came meanwhile


def enabled() -> bool:
    """Whether this worker's agent restarts it in process."""
    return env_vars.AgentFacts.from_environ().inprocess_dir is not None


def _on_abort(signum: int, frame: object) -> None:
    global _deferred
    if _in_attempt and _deferring:
        _deferred = True
    elif _in_attempt:
        raise RestartAttempt("another rank failed: the attempt restarts")


def hold_aborts() -> None:
    """Holds an abort (another rank failed) back until :func:`release_aborts`: from an
    optimizer's step to ``LiveState.step_done()`` the kept objects are being changed, and
    live recovery needs them at a completed step when the attempt ends (see
    :mod:`elastic_train.worker.live.held`). A step that never ends is killed as any
    attempt that does not unwind (``unwind_timeout_s``)."""
    global _deferring
    _deferring = True


def release_aborts() -> None:
    """Ends :func:`hold_aborts`; raises the abort that came meanwhile."""
    global _deferring, _deferred
    _deferring = False
    if _deferred:
        _deferred = False
        raise RestartAttempt("another rank failed: the attempt restarts")


def describe(exc: BaseException) -> FailureNote:
    """``exc`` as the agent records it; a ``sys.exit(N)`` with the code N, as the process
    would have exited with (a code that is no int exits with 1, as Python's does)."""
    code = exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) else 1
    return FailureNote(message=f"{type(exc).__name__}: {exc}",
                       traceback="".join(traceback.format_exception(exc)),
                       primary=not from_communication(exc), timestamp=time.time(),
                       exitcode=code, config_error=isinstance(exc, ConfigError))


def abort_process_groups() -> None:
    """Tears down every process group of this process, now: peers blocked in a collective
    with this worker get an error (gloo: the connection closes; NCCL: the communicators
    are aborted first, so nothing waits on the device)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    try:
        if dist.get_backend() == "nccl":
            dist.distributed_c10d._abort_process_group()
    except Exception:  # noqa: BLE001 -- a broken group is what is being torn down
        logger.debug("Aborting the NCCL communicators failed", exc_info=True)
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        logger.debug("destroy_process_group failed", exc_info=True)


def device_healthy() -> bool:
    """False when this process's CUDA context is unusable (an error that sticks to the
    context, such as an illegal memory access): only a new process recovers from that."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():  # (is_available() poisons forks)
        return True
    try:
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 -- any error here means the context is gone
        logger.error("The CUDA context is unusable after the failure", exc_info=True)
        return False
    return True


def _release_objects() -> None:
    """The failed attempt's objects go: a garbage collection frees what its frames held (a
    DataLoader's worker processes stop when its iterator goes), and multiprocessing
    forgets the children that ended (it keeps each one, and two pipes, until asked)."""
    gc.collect()
    if "multiprocessing" in sys.modules:
        sys.modules["multiprocessing"].active_children()


def _run_one(attempt: Callable[[], T]) -> tuple[bool, T | None, FailureNote | None]:
    """Runs one attempt: (succeeded, its value, this worker's own error if it failed)."""
    global _in_attempt, _deferring, _deferred
    try:
        _in_attempt = True
        try:
            return True, attempt(), None
        finally:
            _in_attempt = _deferring = _deferred = False
    except (KeyboardInterrupt, SystemExit) as exc:
        if isinstance(exc, SystemExit) and exc.code not in (None, 0):
            return False, None, describe(exc)
        raise  # Ctrl-C stops the worker; sys.exit(0) ends the script as usual
    except RestartAttempt as exc:
        cause = exc.__context__  # an error that was on its way out when the signal came
        own = cause if cause is not None and not isinstance(cause, RestartAttempt) else None
        return False, None, describe(own) if own is not None else None
    except BaseException as exc:  # noqa: BLE001 -- every error restarts the attempt
        return False, None, describe(exc)


def _enter(directory: str, attempt: int) -> tuple[int, int]:
    """Waits for the agent's go for ``attempt`` and gives the attempt its environment
    (after a membership change: a new rank, world size, store and generation, and the
    new world's attempt number). Returns the attempt it entered, and this worker's rank."""
    if attempt > 0:
        go = channel.wait_for_go(directory, attempt,
                                 env_vars.AgentFacts.from_environ().generation)
        os.environ.update(go.environ(int(os.environ["LOCAL_RANK"])))
        attempt = go.attempt
    rank = int(os.environ["RANK"])
    channel.write_record(directory, rank, WorkerRecord(attempt, Stage.RUNNING, os.getpid()))
    return attempt, rank


def run_attempts(attempt: Callable[[], T], release: Callable[[float], None]) -> T:
    """Runs ``attempt`` until it succeeds on every rank; returns its value here.

    ``release(finish_s)`` ends what an attempt left behind besides its process groups
    (the session, its uploads); it runs after every failed attempt, and may take
    ``finish_s`` seconds to finish the uploads in flight (the agent's verdict: inf
    when the run stops after this attempt, 0 to drop them; see
    :meth:`~elastic_train.worker.session.TrainSession.end_failed_attempt`).
    """
    facts = env_vars.AgentFacts.from_environ()
    directory, number = facts.inprocess_dir, facts.attempt
    assert directory is not None, "run_attempts needs in-process restarts (see enabled())"
    signal.signal(channel.ABORT_SIGNAL, _on_abort)
    while True:
        number, rank = _enter(directory, number)
        group_sockets.forget()
        ok, value, failure = _run_one(attempt)
        if ok:
            return value  # type: ignore[return-value]
        group_sockets.cut()  # peers blocked in a collective with this worker: released now
        abort_process_groups()
        held.freeze_all()  # a LiveState's last step, kept for the next attempt
        record = WorkerRecord(number, Stage.FAILED, os.getpid(), failure)
        if failure is not None:
            channel.write_record(directory, rank, record)
            sys.stderr.write(failure.traceback if failure.primary
                             else collective_line(failure.message))
        verdict = (channel.wait_for_verdict(directory, number) if uploads_in_flight()
                   else channel.Verdict(number, restart=True))
        if not verdict.restart:
            release(math.inf)
            channel.write_record(directory, rank, replace(record, stage=Stage.STOPPED))
            while True:
                signal.pause()  # the agent stops this worker with the others
        release(verdict.finish_s)
        _release_objects()
        number += 1
        healthy = device_healthy()
        channel.write_record(directory, rank, WorkerRecord(
            number, Stage.READY if healthy else Stage.UNHEALTHY, os.getpid(), failure))
        if not healthy:
            while True:
                signal.pause()  # the agent kills and replaces this worker
