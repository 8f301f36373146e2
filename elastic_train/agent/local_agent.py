"""``TrainAgent``: torch's ``LocalElasticAgent`` with these departures.

1. Each incarnation of the worker group gets a *generation id*, agreed among
   the agents through the rendezvous round's store and given to the workers
   as ``ELASTIC_TRAIN_GENERATION``. Workers namespace their process-group keys
   with it, so a restarted group never reads the addresses of the previous one
   from the agent's long-lived store (the cause of torchrun's intermittent
   ``Gloo connectFullMesh failed`` after a restart).
2. Every failed attempt is reported to a callback before the agent restarts
   the group, so the driver can record it in the run's history; every
   rendezvous is reported too (this node's group rank and the node count).
3. Whether a failed group restarts is decided by a
   :class:`~elastic_train.agent.restart_budget.RestartBudget`, not by torch's
   counter (which this agent sets to the decision before torch reads it).
   Only this node's own failures spend its restart budget: the agents tell
   each other how and when their workers failed and settle which node is at
   fault (:mod:`.attribution`); the others restart for free, and a lost node
   is a membership change (counted in ``membership_changes``), not a failure
   of the job. On a single node every failure is the node's own and is charged.
4. A failure after a preemption notice (see :mod:`elastic_train.worker.preemption`)
   spends the preemption budget (``FailureConfig.max_preemption_failures``)
   instead of the restart budget.
5. A group is stopped for a restart with SIGKILL, not torch's SIGTERM and
   30 s wait -- also the rest of the group that torch's process context
   stops at the first failure, which are then not reported as failures: the
   failed group's state is discarded anyway, SIGTERM is the workers'
   preemption notice (which they outlast), and a worker blocked in a
   collective with a dead peer would only die at the end of the wait.
6. The worker command is asked for again at every start, so a worker zygote
   that died (see :mod:`elastic_train.agent.zygote.server`) is replaced by a new one.
7. Stopping a group stops the workers a zygote forked behind the processes
   torch started, and waits for them (:mod:`.forked_workers`); a group starts
   with an empty staging directory (what a killed attempt staged is stale).
8. With in-process restarts (:mod:`elastic_train.agent.inprocess.restarts`) a failed
   attempt does not stop the group: the agent watches its workers itself
   (torch's process context would stop them all at the first death), charges
   the failure, lets the survivors unwind and start the next attempt, and
   starts a new process only in the slot of a worker that died, hung or lost
   its device. It falls back to torch's restart of the whole group when it
   cannot (a live worker that cannot restart in process, another node that
   gave up or is joining).

Everything else -- rendezvous, spawning, monitoring, restart budget,
membership changes, shutdown -- is torch.distributed.elastic's own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from torch.distributed.elastic.agent.server.api import (
    RunResult,
    WorkerGroup,
    WorkerState,
)
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

from elastic_train import env_vars
from elastic_train.agent import forked_workers, torch_compat
from elastic_train.agent.attribution import FailureExchange, NodeReport, charged
from elastic_train.agent.failures import failures_of, observe
from elastic_train.agent.hang_watch import HangWatch
from elastic_train.agent.inprocess.agent_mixin import InProcessRestart
from elastic_train.agent.inprocess.restarts import InProcessRestarts, InProcessSettings, Recovery
from elastic_train.agent.no_progress_guard import Progress, signature
from elastic_train.agent.restart_budget import Decision, RestartBudget
from elastic_train.agent.worker_slots import surviving
from elastic_train.agent.zygote.preload import ImportWatch
from elastic_train.errors import WorkerFailure
from elastic_train.failure_kinds import FailureKind
from elastic_train.rendezvous_backends import lookup
from elastic_train.worker import preemption

logger = logging.getLogger(__name__)

# (this node's failed workers, root cause first; what the restart budget decided; when
# another node is at fault (PEER), the root cause there, else None)
FailureCallback = Callable[[list[WorkerFailure], Decision, WorkerFailure | None], None]
RendezvousCallback = Callable[[int, int], None]
RecoveryCallback = Callable[[Recovery], None]


@contextlib.contextmanager
def _environ(values: Mapping[str, str]) -> Iterator[None]:
    """Sets environment variables for the block (the children inherit os.environ)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


class TrainAgent(InProcessRestart, LocalElasticAgent):
    """A ``LocalElasticAgent`` that namespaces worker generations and reports failures."""

    def __init__(self, *args: Any, worker_env: Mapping[str, str] | None = None,
                 on_failure: FailureCallback | None = None,
                 on_rendezvous: RendezvousCallback | None = None,
                 hang_watch: HangWatch | None = None, notice_dir: str | None = None,
                 preemption_grace_s: float = 0.0, budget: RestartBudget | None = None,
                 worker_command: Callable[[], tuple[str, tuple[str, ...]]] | None = None,
                 worker_pids_dir: str | None = None, staging_dir: str | None = None,
                 in_process: InProcessSettings | None = None,
                 on_recovered: RecoveryCallback | None = None,
                 progress: Callable[[], Progress | None] | None = None,
                 import_watch: ImportWatch | None = None, shutdown_timeout: int = 30,
                 **kwargs: Any):
        super().__init__(*args, **torch_compat.agent_options(shutdown_timeout), **kwargs)
        self._stop_timeout = shutdown_timeout
        self._import_watch = import_watch
        self._in_process = InProcessRestarts(
            in_process.directory, in_process.unwind_timeout_s, self._replace_worker,
            self._failure_of) if in_process is not None else None
        self._on_recovered = on_recovered
        self._progress = progress
        self._start_env: dict[str, str] = {}
        self.last_failures: list[WorkerFailure] = []
        self.no_progress: str | None = None
        self._worker_command = worker_command
        self._worker_pids_dir = worker_pids_dir
        self._staging_dir = staging_dir
        self._hang_watch = hang_watch
        self._notice_dir = notice_dir
        self._grace_s = preemption_grace_s
        self.budget = budget or RestartBudget(max_failures=self._remaining_restarts)
        self.preemption_budget_spent = False
        self.unkillable: dict[int, str] = {}
        self._rendezvous_count = 0
        self._worker_env = dict(worker_env or {})
        self._on_failure = on_failure
        self._on_rendezvous = on_rendezvous
        self.membership_changes = 0
        self._generation = ""
        self._stopped: set[int] = set()
        # The root cause on the node at fault for the last failed attempt, when another
        # node is (until the next rendezvous): what this node ends with if the job does.
        self.peer_root: WorkerFailure | None = None

    def _rendezvous(self, worker_group: WorkerGroup) -> None:
        previous = worker_group.group_world_size
        super()._rendezvous(worker_group)
        self.peer_root = None
        self._rendezvous_count += 1
        if previous is not None and worker_group.group_world_size != previous:
            self.membership_changes += 1
        if self._on_rendezvous is not None:
            self._on_rendezvous(worker_group.group_rank, worker_group.group_world_size)

    def _agree_on_generation(self, worker_group: WorkerGroup) -> str:
        # A store prefixed by its round (dynamic rendezvous) needs one key per round
        # (restart counts differ between nodes: free restarts, late joiners). The
        # static store is shared by every round, and there every node re-rendezvouses
        # at each restart, so they count alike.
        backend = lookup(worker_group.spec.rdzv_handler.get_backend(), "rdzv_handler")
        key = ("elastic_train/generation/0" if backend.store_per_round
               else f"elastic_train/generation/{self._rendezvous_count}")
        store = worker_group.store
        if worker_group.group_rank == 0:
            store.set(key, uuid.uuid4().hex)
        return store.get(key).decode()

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        generation = self._generation = self._agree_on_generation(worker_group)
        env = {**self._worker_env, env_vars.GENERATION: generation,
               env_vars.AGENT_PID: str(os.getpid())}
        if self._hang_watch is not None:
            self._hang_watch.reset([w.global_rank for w in worker_group.workers])
            env[env_vars.PROGRESS_DIR] = self._hang_watch.progress_dir
        if self._notice_dir is not None:
            preemption.clear(self._notice_dir)
            env[env_vars.PREEMPTION_DIR] = self._notice_dir
            env[env_vars.PREEMPTION_GRACE_S] = str(self._grace_s)
        if self._worker_pids_dir is not None:
            forked_workers.clear(self._worker_pids_dir)
            env[env_vars.WORKER_PIDS_DIR] = self._worker_pids_dir
        if self._staging_dir is not None:
            shutil.rmtree(self._staging_dir, ignore_errors=True)
        if self._import_watch is not None:
            env[env_vars.MODULES_DIR] = self._import_watch.directory
        if self._in_process is not None:
            env.update(self._in_process.begin(
                worker_group.spec.max_restarts - self._remaining_restarts))
        if self._worker_command is not None:  # e.g. a new zygote if the last one died
            worker_group.spec.entrypoint, worker_group.spec.args = self._worker_command()
        self._start_env = env
        with _environ(env):
            pids = super()._start_workers(worker_group)
        self._stop_rest_at_once()
        return pids

    def _stop_rest_at_once(self) -> None:
        """Makes the stop of the rest of the group that torch's process context does on
        the first failure a SIGKILL (it sends SIGTERM and waits 30 s), and notes whom
        it stops: they did not fail (see departure 5)."""
        pcontext, close = self._pcontext, self._pcontext.close
        self._stopped = set()

        def close_at_once(death_sig: signal.Signals | None = None, timeout: int = 30) -> None:
            if death_sig is None:  # torch's own close, at the first failure or the end
                self._stopped |= {pid for pid in pcontext.pids().values()
                                  if forked_workers.start_time(pid) is not None}
                death_sig = signal.SIGKILL
            close(death_sig, timeout)

        pcontext.close = close_at_once

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        if (seen := self._watch_in_process(worker_group)) is not None:
            return seen
        result = super()._monitor_workers(worker_group)
        if result.state == WorkerState.HEALTHY:
            self._check_hangs(worker_group)
        if result.is_failed():
            result.failures = {rank: failure for rank, failure in result.failures.items()
                               if failure.pid not in self._stopped} or result.failures
            self._decide(worker_group, failures_of(result), self._classify(worker_group, result))
        return result

    def _check_hangs(self, worker_group: WorkerGroup) -> None:
        """Stops hung workers (they show up as failures at the next look); hands the
        modules the workers imported to the zygote once they are reported."""
        if self._import_watch is not None:
            self._import_watch.poll()
        if self._hang_watch is not None and self._pcontext is not None:
            pids = self._pcontext.pids()
            self._hang_watch.check({
                w.global_rank: (pids[w.local_rank], self._pcontext.error_files[w.local_rank])
                for w in worker_group.workers if w.local_rank in pids})

    def _decide(self, worker_group: WorkerGroup, failures: list[WorkerFailure],
                kind: FailureKind) -> Decision:
        """Charges a failed attempt to its budget and reports it."""
        progress = self._progress() if self._progress is not None else None
        decision = self.budget.charge(kind, progress, signature(failures[0]))
        self.preemption_budget_spent = decision.preemption_budget_spent
        self.last_failures, self.no_progress = failures, decision.no_progress
        # torch restarts while its counter is positive and takes one off; the workers'
        # TORCHELASTIC_RESTART_COUNT is then max_restarts minus the counter, which
        # this keeps at the number of restarts charged to max_failures.
        spec = worker_group.spec
        self._remaining_restarts = (spec.max_restarts - self.budget.failures + 1
                                    if decision.restart else 0)
        if self._on_failure is not None:
            cause = self.peer_root if kind is FailureKind.PEER else None
            self._on_failure(failures, decision, cause)
        return decision

    def _classify(self, worker_group: WorkerGroup, result: RunResult) -> FailureKind:
        """Which budget the failed attempt spends (see :mod:`.restart_budget`)."""
        if self._preempted():
            return FailureKind.PREEMPTION
        nodes = worker_group.group_world_size or 1
        if nodes == 1:
            return FailureKind.FAILURE
        exchange = FailureExchange(worker_group.store, self._generation)
        mine = exchange.announce(NodeReport.of(worker_group.group_rank, observe(result)))
        others = exchange.share(mine, nodes)
        at_fault = charged(mine, others, nodes)
        if at_fault is mine:
            return FailureKind.FAILURE
        self.peer_root = at_fault.root if at_fault is not None else None
        return FailureKind.PEER

    def _preempted(self) -> bool:
        return self._notice_dir is not None and preemption.marked(self._notice_dir)

    def _stop_workers(self, worker_group: WorkerGroup) -> None:
        self._shutdown(signal.SIGKILL, timeout=30)

    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM,
                  timeout: int | None = None) -> None:
        """torch's shutdown (``death_sig``, then SIGKILL after ``timeout``; by default the
        agent's ``shutdown_timeout``, which torch before 2.12 does not pass), then the
        workers a zygote forked behind those processes are killed as well, and every one
        is waited for (up to ``timeout``): a worker that survives even SIGKILL (stuck in
        uninterruptible I/O, state D) is reported with its pid and state instead of
        being silently left behind."""
        pids = list(self._pcontext.pids().values()) if self._pcontext else []
        forked = forked_workers.behind(self._worker_pids_dir, pids) \
            if self._worker_pids_dir is not None else {}
        timeout = self._stop_timeout if timeout is None else timeout
        torch_compat.shutdown(super()._shutdown, self._pcontext, death_sig, timeout)
        forked_workers.kill(forked)
        self.unkillable = surviving([*pids, *forked], wait_s=max(1.0, timeout))
        for pid, state in self.unkillable.items():
            logger.error("Worker pid %d could not be killed (process state %s, e.g. stuck in "
                         "uninterruptible I/O); it is left behind.", pid, state)
