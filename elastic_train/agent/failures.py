"""What the agent learned about failed workers: :class:`WorkerFailure` records, and how
each worker ended -- by itself, or because another worker failed first.

How a worker ended is read from facts, never from the words of its message:

- ``OWN``: killed by a signal (the OOM killer, a segfault, a kill from outside)
  or exited without recording an exception (``os._exit``, a dead zygote): the
  process ended here, by itself.
- ``RAISED``: an exception (recorded by the worker with its place in the
  group's order of failures, a counter in the group's store). Its own error --
  unless a worker elsewhere failed before it: gloo reports a dead peer as a
  plain ``RuntimeError``, so which came first is settled across nodes by
  :mod:`.attribution`.
- ``BROKEN``: the exception torch raises for a collective whose peer is gone
  (``torch.distributed.DistError``: NCCL's ``DistBackendError``,
  ``DistNetworkError``, ``DistStoreError``), NCCL's watchdog abort
  (SIGABRT), or a hang of a worker that waited in a collective for another
  (:mod:`.hang_watch`): another worker failed first.

Workers the agent itself stopped after the first failure are no failures and
are left out (see :class:`~elastic_train.agent.local_agent.TrainAgent`).
"""

from __future__ import annotations

import enum
import math
import signal
import socket
from dataclasses import dataclass
from typing import Any

from torch.distributed.elastic.agent.server.api import RunResult
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from elastic_train.agent.hang_watch import HUNG, WAITED_FOR_PEER
from elastic_train.errors import ConfigError, WorkerFailure
from elastic_train.worker.lifecycle import EXCEPTION_TYPES, FAILED_AT, FAILED_SEQ

_BROKEN_COLLECTIVE = "torch.distributed.DistError"
_CONFIG_ERROR = f"{ConfigError.__module__}.{ConfigError.__qualname__}"  # never retried


class Cause(enum.Enum):
    OWN = "own"
    RAISED = "raised"
    BROKEN = "broken"


@dataclass(frozen=True)
class Observed:
    """One failed worker: its record, how it ended, and its place in the group's order
    of failures (``seq``; ``inf``: unknown; see
    :func:`~elastic_train.worker.lifecycle.failure_sequence`)."""

    failure: WorkerFailure
    cause: Cause
    seq: float


def _cause(exitcode: int, extra: dict[str, Any]) -> Cause:
    if exitcode == -signal.SIGABRT or _BROKEN_COLLECTIVE in extra.get(EXCEPTION_TYPES, ()) \
            or extra.get(WAITED_FOR_PEER):
        return Cause.BROKEN
    if exitcode < 0 or FAILED_AT not in extra:
        return Cause.OWN
    return Cause.RAISED


def _message(failure: ProcessFailure, data: dict[str, Any]) -> str:
    """The worker's error message; torch's own when it recorded none (a signal's name),
    except its "To enable traceback see: <url>" for a process that exited without an
    exception: that is empty, and :meth:`WorkerFailure.describe` says so."""
    if data:
        return str(data.get("message", ""))
    return str(failure.message) if failure.exitcode < 0 else ""


def observe(result: RunResult) -> list[Observed]:
    """The failed workers of ``result``, root cause first.

    Among them, a worker that ended by itself comes first, then one that raised,
    then one whose collective broke; then one with a traceback before one
    without; then the earliest, then the lowest rank.
    """
    out = []
    for rank, failure in result.failures.items():
        data = failure.error_file_data.get("message") if failure.error_file_data else None
        data = data if isinstance(data, dict) else {}
        extra = data.get("extraInfo", {})
        cause = _cause(failure.exitcode, extra)
        seq = extra.get(FAILED_SEQ)
        seq = float(seq) if cause is Cause.RAISED and isinstance(seq, int) else math.inf
        out.append(Observed(WorkerFailure(
            rank=rank, local_rank=failure.local_rank, pid=failure.pid,
            exitcode=failure.exitcode, message=_message(failure, data),
            traceback=extra.get("py_callstack"), hostname=socket.gethostname(),
            timestamp=float(extra.get(FAILED_AT, failure.timestamp)),
            config_error=_CONFIG_ERROR in extra.get(EXCEPTION_TYPES, ()),
            hung=bool(extra.get(HUNG)),
        ), cause, seq))
    order = list(Cause)
    return sorted(out, key=lambda o: (order.index(o.cause), o.failure.traceback is None,
                                      o.failure.timestamp, o.failure.rank))


def failures_of(result: RunResult) -> list[WorkerFailure]:
    """The failed workers' records, root cause first (see :func:`observe`)."""
    return [o.failure for o in observe(result)]
