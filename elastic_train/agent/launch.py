"""Runs one node's agent: rendezvous, workers, restarts, and the outcome.

:func:`run_agent` is the single entry from the driver (``fit()``) and, later,
``elastic-train launch``. It builds torch's rendezvous handler from the
registry by backend name, runs a :class:`TrainAgent`, and turns the result
into :class:`WorkerFailure` records (rank, exit code or signal, traceback).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from torch.distributed.elastic.agent.server.api import RunResult, WorkerSpec
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous import registry as rdzv_registry

from elastic_train.agent.local_agent import TrainAgent
from elastic_train.errors import WorkerFailure

logger = logging.getLogger(__name__)

# Errors a worker gets when a peer, not itself, failed (gloo and NCCL wording).
_PEER_LOST = re.compile(
    r"Connection (reset|closed) by peer|Broken pipe|remote process exited|"
    r"NCCL communicator was aborted|Connection refused"
)
_HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


@dataclass
class AgentSpec:
    """What one node's agent runs and how.

    ``entrypoint``/``args`` is the worker command; ``worker_env`` is added to
    each worker's environment on top of what torch.distributed.elastic sets.
    """

    entrypoint: str
    args: tuple[str, ...]
    nproc_per_node: int
    run_id: str
    max_restarts: int
    min_nodes: int = 1
    max_nodes: int = 1
    rdzv_backend: str = "c10d"
    rdzv_endpoint: str = "127.0.0.1:0"
    rdzv_configs: dict[str, object] = field(default_factory=dict)
    monitor_interval: float = 0.1
    log_dir: str | None = None
    tee: bool = True
    log_line_prefix_template: str = "[rank${rank}]: "
    worker_env: dict[str, str] = field(default_factory=dict)
    shutdown_timeout: int = 15


class Interrupted(Exception):
    """The agent was stopped by a signal; its workers are already stopped."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


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
        )))
    def rank_key(item: tuple[int, int, WorkerFailure]) -> tuple[bool, bool, int, int]:
        timestamp, rank, failure = item
        secondary = failure.exitcode == -signal.SIGTERM or bool(
            _PEER_LOST.search(failure.message or ""))
        return (secondary, failure.traceback is None, timestamp, rank)

    return [f for _, _, f in sorted(out, key=rank_key)]


@contextlib.contextmanager
def _quiet_torch_agent_logs() -> Iterator[None]:
    """torch's agent logs every step at WARNING/ERROR; the driver reports outcomes itself.

    Set ``ELASTIC_TRAIN_AGENT_LOGS=1`` to see them while debugging the engine.
    """
    if os.environ.get("ELASTIC_TRAIN_AGENT_LOGS") == "1":
        yield
        return
    elastic = logging.getLogger("torch.distributed.elastic")
    saved = elastic.level
    elastic.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        elastic.setLevel(saved)


@contextlib.contextmanager
def _restored_signal_handlers() -> Iterator[None]:
    """torch's process context installs handlers that raise; put the caller's back."""
    saved = {s: signal.getsignal(s) for s in _HANDLED_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)


def run_agent(spec: AgentSpec,
              on_failure: Callable[[list[WorkerFailure], int], None] | None = None
              ) -> list[WorkerFailure]:
    """Runs the workers to the end; returns the final failures (empty on success).

    ``on_failure(failures, restarts_left)`` is called for every failed attempt,
    including the last. Raises :class:`Interrupted` after a SIGINT/SIGTERM, once
    every worker is stopped.
    """
    params = RendezvousParameters(
        backend=spec.rdzv_backend, endpoint=spec.rdzv_endpoint, run_id=spec.run_id,
        min_nodes=spec.min_nodes, max_nodes=spec.max_nodes, **spec.rdzv_configs,
    )
    rdzv_handler = rdzv_registry.get_rendezvous_handler(params)
    worker_spec = WorkerSpec(
        role="trainer", local_world_size=spec.nproc_per_node, entrypoint=spec.entrypoint,
        args=spec.args, rdzv_handler=rdzv_handler, max_restarts=spec.max_restarts,
        monitor_interval=spec.monitor_interval,
    )
    logs = DefaultLogsSpecs(log_dir=spec.log_dir, tee=Std.ALL if spec.tee else Std.NONE)

    def report(result: RunResult, restarts_left: int) -> None:
        if on_failure is not None:
            on_failure(failures_of(result), restarts_left)

    agent = TrainAgent(
        spec=worker_spec, logs_specs=logs, start_method="spawn",
        log_line_prefix_template=spec.log_line_prefix_template,
        shutdown_timeout=spec.shutdown_timeout, worker_env=spec.worker_env,
        on_failure=report,
    )
    with _restored_signal_handlers(), _quiet_torch_agent_logs():
        try:
            result = agent.run()
        except SignalException as exc:
            # Like torchrun, leave the rendezvous open: other nodes may go on without us.
            raise Interrupted(int(exc.sigval)) from None
        rdzv_handler.shutdown()
    return failures_of(result) if result.is_failed() else []
