"""One node's part of a run: the single path behind ``fit()`` and ``elastic-train launch``.

Everything between "settings validated" and "outcome recorded" happens here,
once, for both front-ends: the check that the stored run may be continued, the
run's lease (one job writes a run directory: a second is refused here, see
:mod:`.run_lease`), the node's scratch directory (staging, checkpoint cache, logs
on remote storage),
the worker plan every worker reads (:mod:`elastic_train.worker.worker_plan`, one
file in the scratch directory), the agent's spec, the run's record
(``run.json``, begun by the node that becomes group rank 0; failures; final
status), the live view and callbacks (:mod:`.supervisor`), and the outcome: a
failure becomes the error the user sees, is recorded, and the uploads its
attempt cut short are removed. A front-end keeps only its own validation, its
worker command and its hint texts.

Example (what ``fit()`` does, in short)::

    plan = NodePlan(storage, run_config, scaling, rendezvous, spec={...},
                    hints=FailureHints.for_fit())
    with NodeRun(plan) as node:
        node.run(sys.executable, ("-m", "elastic_train.worker.fit_worker", ...),
                 worker_env={"OMP_NUM_THREADS": "1"})
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from elastic_train._internal import env_vars, scratch
from elastic_train.agent.api import AgentOutcome, AgentSpec, ProcessOptions
from elastic_train.agent.no_progress_guard import Progress
from elastic_train.agent.node_liveness import Beacon
from elastic_train.agent.zygote import server as zygote
from elastic_train.config import RunConfig, ScalingConfig, check_together
from elastic_train.driver import exporters
from elastic_train.driver.console import ConsoleView
from elastic_train.driver.resume_rules import is_launch
from elastic_train.driver.run_lease import RunLease
from elastic_train.driver.run_record import RunRecord
from elastic_train.driver.supervisor import RunSupervisor, read_progress
from elastic_train.errors import (
    NoProgressError,
    PreemptionError,
    TrainingFailedError,
    WorkerFailure,
)
from elastic_train.rendezvous_config import RendezvousConfig
from elastic_train.storage import RunStorage, replica_server
from elastic_train.storage.local_tier import run_group
from elastic_train.storage.replica_server import NodeReplica, ReplicaTLS, new_key
from elastic_train.storage.run_state import RunStatus
from elastic_train.worker import user_code
from elastic_train.worker.worker_plan import WorkerPlan

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FailureHints:
    """How a failed run's error tells the user to go on: ``resume`` (continue from the
    latest checkpoint), ``retry`` (raise the restart budget) and ``no_guard`` (turn the
    no-progress guard off), in the front-end's terms."""

    resume: str
    retry: str
    no_guard: str = "set FailureConfig(max_restarts_without_progress=-1)"

    @classmethod
    def for_fit(cls) -> FailureHints:
        return cls(resume="run fit() again with the same RunConfig(name=..., storage_path=...)",
                   retry="set RunConfig(failure_config=FailureConfig(max_failures=N)) with "
                         "N > 0, or -1 for unlimited retries")


@dataclass
class NodePlan:
    """One node's part of a run, as a front-end settled and validated it.

    Attributes:
        storage: The run directory.
        run_config: Name, failure and checkpoint settings, callbacks, verbosity,
            ``start_over``.
        scaling: Workers per node and the job's node bounds.
        rendezvous: Where the nodes meet, settled (single node: a local store).
        spec: What ``run.json`` records of the run, and a resume is compared with.
        hints: The front-end's words for resuming and retrying.
        accepted: Spec changes this launch accepts on resume (see ``resume_rules``).
        trainable: ``fit()``'s pickled spec, written beside ``run.json`` for restore.
        train_loop_config: ``fit()``'s, shown to the driver-side callbacks.
        view: Which workers' output the console shows, and how it names them.
        process: How the workers' processes are started (role, NUMA binding, ...).
        log_dir: Where worker logs go (default: the run's ``logs/<host>`` on local
            storage, uploaded there at the end from scratch on remote storage).
        monitor_interval: Seconds between the agent's looks at its workers.
        local_addr: This node's address for the rendezvous (None: loopback in a one-node
            job, else its host name).
        user_code: Directories of the user's own code beyond the working directory
            and the driver's script's (the train function's package, the launched
            script's directory): see :mod:`elastic_train.worker.user_code`.
    """

    storage: RunStorage
    run_config: RunConfig
    scaling: ScalingConfig
    rendezvous: RendezvousConfig
    spec: dict[str, Any]
    hints: FailureHints
    accepted: frozenset[str] = frozenset()
    trainable: bytes | None = None
    train_loop_config: dict[str, Any] | None = None
    view: ConsoleView = field(default_factory=ConsoleView)
    process: ProcessOptions = field(default_factory=ProcessOptions)
    log_dir: str | None = None
    monitor_interval: float = 0.1
    local_addr: str | None = None
    user_code: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_together(self.run_config, self.scaling)  # both front-ends, before any process
        env_vars.Switches.from_environ()  # a bad ELASTIC_TRAIN_* switch: named now


class NodeRun:
    """Runs a :class:`NodePlan`; a context manager that owns the node's scratch directory.

    ``__enter__`` checks, before any process starts, that the storage is
    writable and that the stored run (if any) may be continued, and takes the
    run's lease (RunInUseError while another job writes it); the lease and the
    scratch directory live until ``__exit__``.
    """

    def __init__(self, plan: NodePlan):
        self.plan = plan
        self.scratch = ""
        self.lease: RunLease | None = None
        self.user_roots: tuple[str, ...] = ()
        self.replicas: subprocess.Popen | None = None
        self.replica: NodeReplica | None = None
        self.started = 0.0  # when this node's launch began (wall clock)
        self.recorder: Beacon | None = None  # answers while this driver records the run

    def __enter__(self) -> NodeRun:
        self.started = time.time()
        plan = self.plan
        replica_tls = ReplicaTLS.from_conf(plan.rendezvous.conf)  # bad input: before anything
        exporters.check(plan.run_config.metrics_config)  # a taken port, a missing client
        plan.storage.ensure_writable()
        # Every node checks before it starts anything; the node that becomes group
        # rank 0 checks again as it records the launch, and is the one that starts over.
        RunRecord.check_resumable(plan.storage, plan.spec,
                                  start_over=plan.run_config.start_over, accepted=plan.accepted)
        # Settings checked, and before the lease's heartbeat thread: the moment to fork the
        # worker zygote from this process, if it is safe. (An fsspec store with an event
        # loop -- S3, GCS -- has started its IO thread by now, so for those the zygote
        # starts as a fresh interpreter instead: refusing bad input first comes first.)
        self.user_roots = user_code.user_roots(plan.user_code)
        scratch.sweep()  # what drivers killed on this node left (before ours are made)
        if plan.process.zygote:
            zygote.prestart(self.user_roots)
        self.lease = RunLease.acquire(plan.storage, plan.rendezvous, self._description())
        plan.storage.use_fence(self.lease.token)
        self.scratch = scratch.make(scratch.NODE_PREFIX)
        self._start_replica_server(replica_tls)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.recorder is not None:  # after the record's last write: see RunSupervisor
            self.recorder.close()
        if self.replicas is not None:
            replica_server.stop(self.replicas)
        shutil.rmtree(self.scratch, ignore_errors=True)
        if self.lease is not None:
            self.lease.release()

    @property
    def tier_root(self) -> str:
        """The node's local tier (:mod:`elastic_train.storage.local_tier`)."""
        return os.path.join(self.scratch, "checkpoint_cache")

    def _start_replica_server(self, tls: ReplicaTLS | None) -> None:
        """Serves the node's tier to its peers (:mod:`elastic_train.storage.peer_replicas`)
        when the job may have several nodes, a remote store and copies asked for; over
        TLS with ``tls``."""
        plan = self.plan
        if (plan.storage.is_local or plan.scaling.nodes[1] < 2
                or plan.run_config.checkpoint_config.peer_replicas == 0
                or not env_vars.Switches.from_environ().local_tier):
            return
        host = replica_server.host_for(plan.local_addr, plan.rendezvous.endpoint)
        settings = replica_server.ServerSettings(
            self.tier_root, host, run_group(plan.storage.fs, plan.storage.run_path), tls)
        key, url = new_key(), ""  # written nowhere but the 0600 worker plan
        try:
            self.replicas, url = replica_server.start(settings, key)
        except OSError as exc:
            logger.warning("No copies of checkpoint files on this node's peers: %s", exc)
        self.replica = NodeReplica(url, key, settings.tls)

    def _description(self) -> str:
        """Who holds the run, as a second job's refusal names it."""
        front = "`elastic-train launch`" if is_launch(self.plan.spec) else "fit()"
        nodes = self.plan.scaling.nodes[1]
        return front + (f" (rendezvous id {self.plan.rendezvous.run_id})" if nodes > 1 else "")

    @property
    def staging_dir(self) -> str:
        """Where the workers stage checkpoint files before they are uploaded."""
        return os.path.join(self.scratch, "staging")

    def run(self, entrypoint: str, args: tuple[str, ...], worker_env: dict[str, str]) -> None:
        """Runs this node's workers to the end and records the outcome.

        Raises:
            TrainingFailedError: the failure budget is spent (``PreemptionError``
                when it was the preemption budget); recorded in ``run.json``.
                ``NodeLeftError``: this node left on its node policy's word.
            RendezvousLostError: this node lost the job's rendezvous.
            Interrupted: a signal stopped the node; the run is left resumable.
        """
        # Started now, after the zygote was forked from this process (their threads would
        # have kept it from being forked); ended with the run.
        metrics = exporters.start(self.plan.run_config.metrics_config,
                                  self.plan.run_config.name,
                                  self.plan.local_addr or socket.gethostname())
        supervisor = RunSupervisor(self.plan.storage, self.plan.run_config.name,
                                   begin_record=self._begin_record,
                                   check_lease=self.lease.check if self.lease else None,
                                   callbacks=self.plan.run_config.callbacks,
                                   verbose=self.plan.run_config.verbose,
                                   view=self.plan.view,
                                   train_loop_config=self.plan.train_loop_config,
                                   stragglers=self.plan.run_config.straggler_config,
                                   metrics=metrics)
        try:
            outcome = supervisor.run(self._agent_spec(entrypoint, args, worker_env))
            if outcome.left is None:
                supervisor.take_over_if_orphaned()
        finally:
            if metrics is not None:
                metrics.close()
        if outcome.failures or outcome.left is not None:
            raise self._failed(outcome, supervisor)
        if supervisor.record is not None:
            supervisor.record.set_status(RunStatus.FINISHED)
            supervisor.say_goodput()

    def _begin_record(self, takeover: bool) -> RunRecord:
        """This driver records the run from here on; in a job that may have several nodes,
        with a beacon of its own that the launch record names, so that the others know it
        is there whatever their group ranks (see :class:`RunSupervisor`)."""
        plan = self.plan
        if plan.scaling.nodes[1] > 1 and self.recorder is None:
            self.recorder = Beacon(plan.local_addr or socket.getfqdn())
        record = RunRecord.begin(plan.storage, plan.run_config.name, plan.spec,
                                 start_over=plan.run_config.start_over, accepted=plan.accepted,
                                 launched_at=self.started, takeover=takeover,
                                 recorder=self.recorder.address if self.recorder else None)
        if plan.trainable is not None:
            plan.storage.write_trainable(plan.trainable)
        return record

    def _agent_spec(self, entrypoint: str, args: tuple[str, ...],
                    worker_env: dict[str, str]) -> AgentSpec:
        plan = self.plan
        log_dir = plan.log_dir or (
            os.path.join(plan.storage.log_dir(), socket.gethostname()) if plan.storage.is_local
            else os.path.join(self.scratch, "logs"))
        min_nodes, max_nodes = plan.scaling.nodes
        return AgentSpec(
            entrypoint=entrypoint, args=args, nproc_per_node=plan.scaling.workers_per_node,
            rendezvous=plan.rendezvous, failure=plan.run_config.failure_config,
            min_nodes=min_nodes, max_nodes=max_nodes, monitor_interval=plan.monitor_interval,
            log_dir=log_dir, agent_logs=plan.run_config.verbose >= 2, local_addr=plan.local_addr,
            process=plan.process, staging_dir=self.staging_dir, private_dir=self.scratch,
            departures=plan.storage.read_departures,
            worker_env={**self.worker_plan().write(self.scratch), **worker_env})

    def worker_plan(self) -> WorkerPlan:
        """What this node tells its workers of the run and the node."""
        run_config, scaling = self.plan.run_config, self.plan.scaling
        min_nodes, max_nodes = scaling.nodes
        return WorkerPlan(
            run_name=run_config.name, checkpoint_config=run_config.checkpoint_config,
            staging_dir=self.staging_dir,
            tier_root=self.tier_root, replica=self.replica,
            keep_uploads=env_vars.Switches.from_environ().local_tier,
            storage_retry_s=run_config.storage_retry_timeout_s,
            lease_token=self.lease.token if self.lease else None, user_roots=self.user_roots,
            world_sizes=tuple(nodes * scaling.workers_per_node
                              for nodes in range(min_nodes, max_nodes + 1)))

    def _retry_helps(self, root: WorkerFailure) -> bool:
        """Whether retrying could get past ``root``: not when it is an exception raised
        before the run made any progress (no report, no checkpoint), which a new attempt
        would raise again at the same place."""
        if not root.traceback or root.exitcode <= 0:
            return True  # a signal, an exit without an exception: maybe the machine's
        progress = read_progress(self.plan.storage)
        return progress is None or progress.beyond(Progress())

    def _failed(self, outcome: AgentOutcome, supervisor: RunSupervisor) -> TrainingFailedError:
        """The error for a spent budget, a run that stopped making progress, or a node that
        left the job on its node policy's word; recorded (a node that leaves ends the run
        only when no other node of the job still runs on it), and the run's cut-short
        uploads removed by the node that records the run when it is the job's last."""
        budget = self.plan.run_config.failure_config
        preempted = outcome.preempted_out
        hints = {"resume_hint": self.plan.hints.resume, "retry_hint": self.plan.hints.retry}
        if outcome.left is not None:
            error: TrainingFailedError = outcome.left
            error.run_path = self.plan.storage.display_path
        elif outcome.no_progress is not None:
            error = NoProgressError.stopped(
                outcome.no_progress, outcome.failures, self.plan.storage.display_path,
                resume_hint=self.plan.hints.resume, guard_hint=self.plan.hints.no_guard)
        else:
            error = (PreemptionError if preempted else TrainingFailedError).from_failures(
                outcome.failures, self.plan.storage.display_path,
                budget.max_preemption_failures if preempted else budget.max_failures,
                retry_helps=self._retry_helps(outcome.failures[0]), **hints)
        if supervisor.record is None:
            return error
        sole = self.lease is not None and self.lease.is_sole_member()
        if outcome.left is None or sole:
            supervisor.record.set_status(RunStatus.FAILED, error=str(error),
                                         no_progress=outcome.no_progress)
            supervisor.say_goodput()
        if sole:
            self.plan.storage.discard_unfinished_uploads()
        return error

