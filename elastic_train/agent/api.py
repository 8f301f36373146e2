"""Runs one node's agent: rendezvous, workers, restarts, and the outcome.

:func:`run_agent` is the single entry from the driver's node-run path
(:mod:`elastic_train.driver.node_run`, behind ``fit()`` and ``elastic-train
launch``). It builds torch's rendezvous handler from the registry by backend
name, runs a :class:`TrainAgent`, and turns the result into
:class:`WorkerFailure` records (rank, exit code or signal, traceback).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import os
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from torch.distributed import DistNetworkError
from torch.distributed.elastic.agent.server.api import WorkerSpec
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousParameters,
    RendezvousStateError,
)
from torch.distributed.elastic.rendezvous import registry as rdzv_registry

from elastic_train._internal.departures import Departure
from elastic_train._internal.rendezvous_backends import StateHome, lookup
from elastic_train.agent import node_policy, torch_compat
from elastic_train.agent.cooling_off import CoolingOff
from elastic_train.agent.failures import failures_of
from elastic_train.agent.hang_watch import HangWatch
from elastic_train.agent.inprocess.restarts import InProcessSettings
from elastic_train.agent.local_agent import TrainAgent
from elastic_train.agent.no_progress_guard import NoProgressGuard, Progress
from elastic_train.agent.node_policy import POLICY_SETTING, NodeStanding, node_name
from elastic_train.agent.options import AgentEvents, AgentOptions, WorkerCommand
from elastic_train.agent.rendezvous import state_poll
from elastic_train.agent.rendezvous.registry import register
from elastic_train.agent.rendezvous.store_host import hosts_store
from elastic_train.agent.restart_budget import RestartBudget
from elastic_train.agent.zygote import server as zygote
from elastic_train.agent.zygote.preload import ImportWatch
from elastic_train.config import FailureConfig
from elastic_train.errors import NodeLeftError, RendezvousLostError, WorkerFailure
from elastic_train.rendezvous_config import LOOPBACK, RendezvousConfig

logger = logging.getLogger(__name__)

_SIGNALS_VARIABLE = "TORCHELASTIC_SIGNALS_TO_HANDLE"

DEFAULT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"  # torchrun's --signals-to-handle


@dataclass(frozen=True)
class ProcessOptions:
    """How the workers' processes are started and named (torchrun's per-process flags).

    Attributes:
        role: The workers' role (``ROLE_NAME``; torchrun's ``--role``).
        event_log_handler: torch's event handler for the agent's events
            (``--event-log-handler``).
        numa_binding: An affinity mode of ``torch.numa.binding`` (``--numa-binding``);
            the binding wraps the worker's command with ``numactl``, so such workers
            start as fresh interpreters, not from the zygote.
        virtual_local_rank: ``LOCAL_RANK=0`` and one visible device per worker
            (``--virtual-local-rank``).
        signals_to_handle: Signals the agent stops the workers on, passing them on
            (``--signals-to-handle``).
        zygote: Fork workers from the zygote when they allow it (see :mod:`.zygote`).
    """

    role: str = "trainer"
    event_log_handler: str = "null"
    numa_binding: str | None = None
    virtual_local_rank: bool = False
    signals_to_handle: str = DEFAULT_SIGNALS
    zygote: bool = True


@dataclass
class AgentSpec:
    """What one node's agent runs and how.

    ``entrypoint``/``args`` is the worker command; ``worker_env`` is added to
    each worker's environment on top of what torch.distributed.elastic sets.
    ``rendezvous`` says where the nodes meet (settled: backend, endpoint and
    run id all given) and ``failure`` the restart, hang and preemption
    budgets. Workers write to their log files under ``log_dir`` only; the
    driver's console shows them (see :mod:`elastic_train.driver.console`).
    ``agent_logs`` shows torch.distributed.elastic's own logs too. When the
    agent gets a SIGTERM it passes it on to the workers (a preemption notice)
    and kills them ``failure.preemption_grace_s`` later. ``staging_dir`` (where
    workers stage checkpoint files) is emptied before each group starts.
    ``private_dir`` is this agent's own (the node's scratch directory): the
    in-process restart records and the workers' module lists go there, never
    beside the logs, which a later job on the same run shares while an earlier
    one may still be writing (default: the log directory). ``departures`` reads
    the nodes that left the job (the run directory's, see
    :mod:`elastic_train._internal.departures`): in a job that sends nodes away
    (:func:`sends_nodes_away`), a node still cooling off is not admitted
    (:mod:`.cooling_off`; None: nothing keeps a node out).
    """

    entrypoint: str
    args: tuple[str, ...]
    nproc_per_node: int
    rendezvous: RendezvousConfig
    failure: FailureConfig
    min_nodes: int = 1
    max_nodes: int = 1
    monitor_interval: float = 0.1
    log_dir: str | None = None
    agent_logs: bool = False
    worker_env: dict[str, str] = field(default_factory=dict)
    local_addr: str | None = None
    staging_dir: str | None = None
    private_dir: str | None = None
    process: ProcessOptions = field(default_factory=ProcessOptions)
    departures: Callable[[], list[Departure]] | None = None

    @property
    def node_addr(self) -> str | None:
        """The address this node's rendezvous store and its workers' ``MASTER_ADDR`` are
        reached at: ``local_addr``; else loopback in a one-node job, as torchrun's
        ``--standalone`` (the host's own name may not resolve: c10d would then wait on
        getaddrinfo until killed); else None, torch's choice (the host's FQDN)."""
        return self.local_addr or (LOOPBACK if self.max_nodes == 1 else None)


class Interrupted(Exception):
    """The agent was stopped by a signal; its workers are already stopped."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


@contextlib.contextmanager
def _quiet_torch_agent_logs() -> Iterator[None]:
    """torch's agent logs every step at WARNING/ERROR ("Received 2 death signal, shutting
    down workers" at a Ctrl-C); the driver reports outcomes itself. Each of torch's
    module loggers sets its own level, so each one is raised, not only their parent."""
    manager = logging.getLogger().manager
    loggers = [logging.getLogger("torch.distributed.elastic"), *(
        logger for name, logger in list(manager.loggerDict.items())
        if name.startswith("torch.distributed.elastic.") and isinstance(logger, logging.Logger))]
    saved = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, saved, strict=True):
            logger.setLevel(level)


@contextlib.contextmanager
def _handling_signals(names: str) -> Iterator[None]:
    """torch's process context installs handlers that raise for the signals named in
    ``TORCHELASTIC_SIGNALS_TO_HANDLE`` (torchrun sets it from --signals-to-handle) when it
    starts the workers; the same handler is installed here from the start, so that a
    Ctrl-C before the workers start (in the rendezvous, as they are started) is the same
    interruption, not a bare KeyboardInterrupt that skips the agent's shutdown and is
    recorded as a failure. The caller's handlers and the variable are put back afterwards."""
    signals = [getattr(signal, name) for name in names.split(",")]
    saved = {s: signal.getsignal(s) for s in signals}
    variable = os.environ.get(_SIGNALS_VARIABLE)
    os.environ[_SIGNALS_VARIABLE] = names
    if threading.current_thread() is threading.main_thread():  # as torch's context does
        for sig in signals:
            signal.signal(sig, _raise_signal_exception)
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)
        if variable is None:
            os.environ.pop(_SIGNALS_VARIABLE, None)
        else:
            os.environ[_SIGNALS_VARIABLE] = variable


@dataclass(frozen=True)
class AgentOutcome:
    """How the agent ended: the final failures (empty on success), whether it was the
    preemption budget that ran out, why it stopped without progress (if it did), and
    whether this node left the job on its node policy's word (see :mod:`.node_policy`)."""

    failures: list[WorkerFailure]
    preempted_out: bool = False
    no_progress: str | None = None
    left: NodeLeftError | None = None


def run_agent(spec: AgentSpec, events: AgentEvents | None = None) -> AgentOutcome:
    """Runs the workers to the end.

    When the job ends because another node spent its budget (it closes the
    rendezvous), the failures are that node's root cause. Raises
    :class:`Interrupted` after a SIGINT/SIGTERM, once every worker is stopped,
    and :class:`RendezvousLostError` when the rendezvous became unreachable
    (with c10d: the node hosting its store is gone).
    """
    agent = _train_agent(spec, events or AgentEvents())
    rdzv_handler, rdzv = agent.get_worker_group().spec.rdzv_handler, spec.rendezvous
    quiet = contextlib.nullcontext() if spec.agent_logs else _quiet_torch_agent_logs()
    with _handling_signals(spec.process.signals_to_handle), quiet, _released(rdzv_handler):
        try:
            result = agent.run()
        except SignalException as exc:
            # Like torchrun, leave the rendezvous open: other nodes may go on without us.
            raise Interrupted(int(exc.sigval)) from None
        except RendezvousStateError as exc:
            raise _corrupt_state(rdzv, exc) from exc
        except (RendezvousClosedError, RendezvousConnectionError, DistNetworkError) as exc:
            if agent.peer_root is not None:  # the node at fault spent its budget and left
                return AgentOutcome([agent.peer_root])
            backend = lookup(rdzv.backend, "RendezvousConfig.backend")
            if isinstance(exc, RendezvousClosedError) or (
                    isinstance(exc, DistNetworkError) and not backend.endpoint_is_node_store):
                raise
            raise RendezvousLostError.for_backend(backend.name, rdzv.endpoint, exc,
                                                  backend.endpoint_is_node_store) from exc
        except NodeLeftError as exc:  # not admitted to a round: the others go on
            return AgentOutcome([], left=exc)
        if agent.leaving is None:  # a node that leaves keeps the rendezvous open
            rdzv_handler.shutdown()
    if result is None:  # torch's agent: the rendezvous closed while this node was a spare
        logger.info("The job finished without needing this node (it waited as a spare).")
        return AgentOutcome([])
    if not result.is_failed():
        return AgentOutcome([])
    failures = agent.last_failures or failures_of(result)
    if agent.leaving is not None:
        return AgentOutcome(failures, left=NodeLeftError(
            agent.options.node.node, agent.leaving.reason, agent.leaving.cool_off_s, failures))
    return AgentOutcome(failures, agent.preemption_budget_spent, agent.no_progress)


def _raise_signal_exception(signum: int, _frame: object) -> None:
    """The handler torch's process context installs: the signal as a ``SignalException``,
    which torch's agent answers by stopping the workers with it (see :func:`run_agent`)."""
    sig = signal.Signals(signum)
    raise SignalException(f"Process {os.getpid()} got signal: {sig.name}", sigval=sig)


@contextlib.contextmanager
def _released(rdzv_handler: Any) -> Iterator[None]:
    """However the block ends, the handler's background work (the etcd backends' lease
    refresh, heartbeats) stops: its ``release()``, for handlers that have one, stops it
    without closing the rendezvous; torch's handlers' keep-alive timer is stopped the
    same way (:func:`torch_compat.stop_keep_alive`). Otherwise a failed or interrupted
    agent in a notebook or a sweep keeps the node's etcd keys alive for good, and an
    interrupted launcher can abort at exit in a heartbeat's store call."""
    try:
        yield
    finally:
        release = getattr(rdzv_handler, "release", None) or functools.partial(
            torch_compat.stop_keep_alive, rdzv_handler)
        try:
            release()
        except Exception:  # the keys expire with their lease anyway
            logger.warning("Could not stop the rendezvous handler's lease refresh",
                           exc_info=True)


def _corrupt_state(rdzv: RendezvousConfig, exc: RendezvousStateError) -> RendezvousLostError:
    """The error for a rendezvous state this node cannot read, with the fix for where the
    state lives."""
    backend = lookup(rdzv.backend, "RendezvousConfig.backend")
    prefix = ""
    if backend.state is StateHome.ETCD:
        from elastic_train.agent.rendezvous.etcd_v3 import run_prefix

        prefix = run_prefix(rdzv.run_id)
    return RendezvousLostError.corrupt_state(backend.name, rdzv.endpoint, rdzv.run_id, exc,
                                             etcd_prefix=prefix)


def sends_nodes_away(spec: AgentSpec, events: AgentEvents) -> bool:
    """Whether a node of this job may leave it while the job goes on: the job has a node
    policy (:mod:`.node_policy`), or its stragglers are replaced with spares
    (``events.leave_request``). Only such a job keeps departures and their cooling-off
    periods; the others never read them."""
    return node_policy.named_in(spec.rendezvous.conf) is not None \
        or events.leave_request is not None


def _train_agent(spec: AgentSpec, events: AgentEvents) -> TrainAgent:
    """torch's rendezvous handler (from its registry, by backend name) and our agent."""
    node = _node_standing(spec, events)
    rdzv_handler = _rendezvous_handler(spec, node)
    poll_s = state_poll.interval_s(spec.max_nodes)
    state_poll.read_every(rdzv_handler, poll_s)
    events = _keep_the_store_host(spec.rendezvous, events)
    worker_command = functools.partial(_worker_command, spec)
    entrypoint, args = worker_command()  # starts the zygote now, during the rendezvous
    process = spec.process
    worker_spec = WorkerSpec(
        role=process.role, local_world_size=spec.nproc_per_node, entrypoint=entrypoint,
        args=args, rdzv_handler=rdzv_handler, max_restarts=spec.failure.max_restarts,
        monitor_interval=spec.monitor_interval, local_addr=spec.node_addr,
        event_log_handler=process.event_log_handler,
        **torch_compat.worker_spec_options(process.numa_binding, process.virtual_local_rank),
    )
    logs = DefaultLogsSpecs(log_dir=spec.log_dir, redirects=Std.ALL, tee=Std.NONE)
    options = _agent_options(spec, events, logs.root_log_dir, node, poll_s, worker_command)
    return TrainAgent(spec=worker_spec, logs_specs=logs, start_method="spawn",
                      options=options, events=events)


def _node_standing(spec: AgentSpec, events: AgentEvents) -> NodeStanding:
    """This node under the job's node policy, which keeps out, in a job that sends nodes
    away, the nodes still cooling off after they left."""
    policy = node_policy.load(node_policy.named_in(spec.rendezvous.conf))
    if sends_nodes_away(spec, events) and spec.departures is not None:
        policy = CoolingOff(policy, spec.departures)
    return NodeStanding(policy, node_name(spec.local_addr))


def _rendezvous_handler(spec: AgentSpec, node: NodeStanding) -> Any:
    """torch's handler of the job's backend, ours registered into torch's registry first;
    our etcd handler's sealer asks ``node``'s policy, as the agent does."""
    rdzv = spec.rendezvous
    params = RendezvousParameters(
        backend=rdzv.backend, endpoint=rdzv.endpoint, run_id=rdzv.run_id,
        min_nodes=spec.min_nodes, max_nodes=spec.max_nodes, local_addr=spec.node_addr,
        **{**(rdzv.conf or {}), POLICY_SETTING: node.policy},
    )
    register(lookup(rdzv.backend, "RendezvousConfig.backend"))
    return rdzv_registry.get_rendezvous_handler(params)


def _keep_the_store_host(rdzv: RendezvousConfig, events: AgentEvents) -> AgentEvents:
    """``events`` without the leave request on the node that hosts the job's rendezvous
    store: the job would end with it, so it is never replaced as a straggler."""
    if events.leave_request is None or not hosts_store(rdzv):
        return events
    logger.warning("This node hosts the job's rendezvous store (%s at %s): were it "
                   "replaced as a straggler, the job would end with it, so it stays "
                   "whatever its pace (with etcd any node can be replaced).",
                   rdzv.backend, rdzv.endpoint)
    return dataclasses.replace(events, leave_request=None)


def _worker_command(spec: AgentSpec) -> tuple[str, tuple[str, ...]]:
    """The workers' command, asked for at every start: through the zygote when it is on
    (a new zygote when the last one died), else the spec's."""
    if not spec.process.zygote:
        return spec.entrypoint, spec.args
    return zygote.worker_command(spec.entrypoint, spec.args)


def _agent_options(spec: AgentSpec, events: AgentEvents, log_root: str, node: NodeStanding,
                   poll_s: float, worker_command: WorkerCommand) -> AgentOptions:
    """The agent's options from the spec: its restart budget, the watches the failure
    settings turn on, and where its records go (beside the logs under ``log_root``, or
    in the node's private directory)."""
    failure = spec.failure
    private = spec.private_dir or log_root
    return AgentOptions(
        shutdown_timeout=math.ceil(failure.preemption_grace_s), worker_env=spec.worker_env,
        notice_dir=os.path.join(log_root, "preemption"),
        preemption_grace_s=failure.preemption_grace_s,
        budget=RestartBudget(max_failures=failure.max_failures,
                             max_preemptions=failure.max_preemption_failures,
                             guard=NoProgressGuard(failure.max_restarts_without_progress,
                                                   _progress_now(events.progress))),
        worker_command=worker_command, node=node,
        rendezvous_poll_s=poll_s,
        worker_pids_dir=os.path.join(log_root, "worker_pids"),
        staging_dir=spec.staging_dir,
        import_watch=ImportWatch(os.path.join(private, "modules"), zygote.preload)
        if zygote.enabled() and spec.process.zygote else None,
        in_process=InProcessSettings(os.path.join(private, "inprocess"),
                                     failure.unwind_timeout_s)
        if failure.restart_in_process else None,
        hang_watch=HangWatch(os.path.join(log_root, "progress"),
                             failure.hang_timeout_s) if failure.hang_timeout_s else None,
    )


def _progress_now(progress: Callable[[], Progress | None] | None) -> Progress:
    """Where the run starts: what the guard measures the first attempt's progress from."""
    start = progress() if progress is not None else None
    return start or Progress()
