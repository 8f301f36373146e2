"""What every worker process does first and last, whatever it runs.

It dies with its agent (``PR_SET_PDEATHSIG``), so a killed agent or driver
leaves no orphan; and an error ends it at once after the traceback is written
to torch.distributed.elastic's error file, which is how the driver learns the
worker's own traceback.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from types import TracebackType
from typing import Any

from elastic_train._internal import env_vars
from elastic_train.storage import filesystem as fsutil
from elastic_train.worker import heartbeat, worker_plan

_PR_SET_PDEATHSIG = 1
# Ours in the error file's extraInfo, read by the agent (elastic_train.agent.failures):
FAILED_AT = "failed_at"  # time.time() when the exception ended the worker (for people)
FAILED_SEQ = "failed_seq"  # its place among the group's failures (see failure_sequence)
EXCEPTION_TYPES = "exception_types"  # its classes, most derived first ("module.QualName")
_SEQUENCE_TIMEOUT_S = 5.0
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Where an error comes from when a peer, not this worker, failed: a collective, DDP's
# reducer (its all-reduce runs inside backward()), or the autograd engine around it.
_COMMUNICATION = tuple(os.path.join("torch", part, "") for part in
                       ("distributed", os.path.join("nn", "parallel"), "autograd"))


def die_with_parent() -> None:
    """Asks the kernel to SIGKILL this process when its parent dies."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def die_with_agent() -> None:
    """:func:`die_with_parent`, checking the parent is still the agent (or the zygote
    it forked from, see :mod:`elastic_train.agent.zygote.server`)."""
    die_with_parent()
    agent_pid = env_vars.AgentFacts.from_environ().agent_pid
    if agent_pid is not None and os.getppid() != agent_pid:
        os._exit(1)  # the agent died before the request took effect


def _group_store() -> Any:
    """The store of this worker's process group, or None (none initialised)."""
    dist = sys.modules.get("torch.distributed")  # not imported: no process group
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist.distributed_c10d._get_default_store()


def failure_sequence() -> int | None:
    """This failure's place among the failures of the worker group, or None (no process
    group, or its store is gone).

    A counter in the group's store, taken before this process exits -- so before a
    peer on another node can see it gone and fail in turn. Which node failed first is
    settled by it (:mod:`elastic_train.agent.attribution`), never by the nodes' clocks,
    which may be further apart than the failures.
    """
    try:
        store = _group_store()
        if store is None:
            return None
        with contextlib.suppress(Exception):  # a store of the dying group may hang
            store.set_timeout(timedelta(seconds=_SEQUENCE_TIMEOUT_S))
        generation = env_vars.AgentFacts.from_environ().generation or ""
        return int(store.add(f"elastic_train/failed_seq/{generation}", 1))
    except Exception:  # noqa: BLE001 -- the error file must be written regardless
        return None


def write_error_file(exc: BaseException) -> None:
    """Writes the error for the agent in torch.distributed.elastic's error-file format.

    Atomically: the agent may read the file the moment this process exits or
    a peer fails, and torch's own writer can leave it half-written then.
    """
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {"message": {
        "message": f"{type(exc).__name__}: {exc}",
        "extraInfo": {"py_callstack": "".join(traceback.format_exception(exc)),
                      "timestamp": str(int(time.time())), FAILED_AT: time.time(),
                      FAILED_SEQ: failure_sequence(),
                      EXCEPTION_TYPES: [f"{c.__module__}.{c.__qualname__}"
                                        for c in type(exc).__mro__]},
    }}
    fsutil.write_local_atomic(path, json.dumps(data).encode())


def _user_frames(tb: TracebackType | None) -> TracebackType | None:
    """Drops the leading frames of this package and runpy, so the traceback starts in
    user code."""
    first = tb
    while tb is not None and (tb.tb_frame.f_code.co_filename.startswith(_PACKAGE + os.sep)
                              or tb.tb_frame.f_code.co_filename == "<frozen runpy>"):
        tb = tb.tb_next
    return tb or first


def from_communication(exc: BaseException) -> bool:
    """Whether ``exc`` came out of torch's communication code (then a peer may be the
    cause), judged by where it was raised, never by its message."""
    tb: TracebackType | None = exc.__traceback__
    last = None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return last is not None and any(part in last.tb_frame.f_code.co_filename
                                    for part in _COMMUNICATION)


def collective_line(message: str) -> str:
    """How a survivor's error out of a collective shows on its console: one line (its
    traceback, 25 lines of gloo's or NCCL's, stays in the error record, which
    ``elastic-train show --json`` shows). ``message``: ``"Type: text"``."""
    first = (message.strip().splitlines() or [""])[0]
    return f"{first} (out of a collective: a peer may have failed first)\n"


def print_error(exc: BaseException) -> None:
    """The worker's error on its stderr (the console): its traceback, or one line for an
    error out of a collective, which a peer's failure causes in every survivor; nothing
    for a Ctrl-C (every rank has it, and the driver says what it did)."""
    if isinstance(exc, KeyboardInterrupt):
        pass
    elif from_communication(exc):
        sys.stderr.write(collective_line(f"{type(exc).__name__}: {exc}"))
    else:
        traceback.print_exception(exc)
    sys.stderr.flush()


def run_worker(main: Callable[[], None]) -> None:
    """Runs ``main`` as a worker; on error, records the traceback and exits at once.

    A failed worker does not tear down its process group: peers may be blocked
    in a collective with it, and the agent stops the whole group anyway.
    """
    die_with_agent()
    # Unbuffered, as `python -u`: the driver's console tails the worker's log files.
    sys.stdout.reconfigure(write_through=True)
    sys.stderr.reconfigure(write_through=True)
    # No logging.basicConfig: the user's script configures logging (a basicConfig of its
    # own would be ignored after ours); our warnings reach stderr through logging's
    # last-resort handler until it does.
    faulthandler.enable()
    worker_plan.install()
    heartbeat.arm()
    try:
        main()
    except SystemExit as exc:
        if exc.code in (None, 0):
            raise
        exc.__traceback__ = _user_frames(exc.__traceback__)
        write_error_file(exc)
        raise
    except BaseException as exc:  # noqa: BLE001 -- every error must reach the driver
        exc.__traceback__ = _user_frames(exc.__traceback__)
        write_error_file(exc)
        print_error(exc)
        sys.stdout.flush()
        os._exit(1)
