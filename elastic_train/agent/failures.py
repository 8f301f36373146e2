"""What the agent learned about failed workers, as :class:`WorkerFailure` records.

A failure is *secondary* when the worker did not fail by itself: the agent
stopped it (SIGTERM) after another worker failed, or its collective broke
because a peer -- possibly on another node -- died. Secondary failures are
reported after the root cause and are not charged to this node's restart budget.
"""

from __future__ import annotations

import re
import signal
import socket

from torch.distributed.elastic.agent.server.api import RunResult

from elastic_train.errors import WorkerFailure

# Errors a worker gets when a peer, not itself, failed (gloo and NCCL wording).
_PEER_LOST = re.compile(
    r"Connection (reset|closed) by peer|Broken pipe|remote process exited|"
    r"NCCL communicator was aborted|Connection refused"
)


def is_secondary(failure: WorkerFailure) -> bool:
    """Whether the worker failed because of another worker or the agent, not by itself."""
    return failure.exitcode == -signal.SIGTERM or bool(_PEER_LOST.search(failure.message or ""))


def failures_of(result: RunResult) -> list[WorkerFailure]:
    """The failed workers of a result, root cause first.

    Secondary failures -- the agent's own SIGTERM to the survivors, and
    collectives that broke because a peer died -- come last; among the rest, a
    failure with a traceback comes before one without, then the earliest.
    """
    out = []
    for rank, failure in result.failures.items():
        traceback = None
        data = failure.error_file_data.get("message") if failure.error_file_data else None
        if isinstance(data, dict):
            traceback = data.get("extraInfo", {}).get("py_callstack")
        out.append((failure.timestamp, rank, WorkerFailure(
            rank=rank, local_rank=failure.local_rank, pid=failure.pid,
            exitcode=failure.exitcode,
            message=data.get("message", "") if isinstance(data, dict) else str(failure.message),
            traceback=traceback, hostname=socket.gethostname(),
            timestamp=float(failure.timestamp),
        )))
    def rank_key(item: tuple[int, int, WorkerFailure]) -> tuple[bool, bool, int, int]:
        timestamp, rank, failure = item
        return (is_secondary(failure), failure.traceback is None, timestamp, rank)

    return [f for _, _, f in sorted(out, key=rank_key)]
