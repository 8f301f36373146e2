"""``TrainAgent``: torch's ``LocalElasticAgent`` with these changes, each named (the
name is how code and docs refer to it).

- **Generation ids.** Each incarnation of the worker group gets a *generation id*, agreed
  among the agents through the rendezvous round's store and given to the workers as
  ``ELASTIC_TRAIN_GENERATION``. Workers namespace their process-group keys with it, so a
  restarted group never reads the addresses of the previous one from the agent's long-lived
  store (the cause of torchrun's intermittent ``Gloo connectFullMesh failed`` after a
  restart).
- **Attempts reported.** Every failed attempt is reported to a callback before the agent
  restarts the group, so the driver can record it in the run's history; every rendezvous is
  reported too (this node's group rank and the node count).
- **Our restart decision.** Whether a failed group restarts is decided by a
  :class:`~elastic_train.agent.restart_budget.RestartBudget`, not by torch's counter (which
  this agent derives from the budget in one place, :func:`torch_restarts_left`, before torch
  reads it), and whether this node stays in the job by its node policy
  (:mod:`elastic_train.agent.node_policy`), asked after each failure and before each
  rendezvous. Only this node's own failures spend its restart budget: the
  agents tell each other how and when their workers failed and settle which node is at fault
  (:mod:`.attribution`); the others restart for free, and a lost node is a membership change
  (counted in ``membership_changes``), not a failure of the job. On a single node every
  failure is the node's own and is charged. Nobody waits for a node known gone, and a lost
  node's failure is charged to none of the survivors (:mod:`.node_liveness`: each agent's
  beacon, probed by the others; :attr:`TrainAgent.liveness` answers for the current round).
  Before it joins the next round, a survivor drops the nodes known gone from torch's dynamic
  rendezvous (c10d, etcd-v3), which would wait for their heartbeats to age, and ends the
  next round's last call once every survivor is in
  (:mod:`elastic_train.agent.rendezvous.gone_nodes`).
- **Preemption budget.** A failure after a preemption notice (see
  :mod:`elastic_train.worker.preemption`) spends the preemption budget
  (``FailureConfig.max_preemption_failures``) instead of the restart budget.
- **SIGKILL stops.** A group is stopped for a restart with SIGKILL, not torch's SIGTERM and
  30 s wait -- also the rest of the group that torch's process context stops at the first
  failure, which are then not reported as failures: the failed group's state is discarded
  anyway, SIGTERM is the workers' preemption notice (which they outlast), and a worker
  blocked in a collective with a dead peer would only die at the end of the wait.
- **A live zygote at every start.** The worker command is asked for again at every start, so
  a worker zygote that died (see :mod:`elastic_train.agent.zygote.server`) is replaced by a
  new one.
- **Forked workers stopped.** Stopping a group stops the workers a zygote forked behind the
  processes torch started, and waits for them (:mod:`.forked_workers`); a group starts with
  an empty staging directory (what a killed attempt staged is stale).
- **In-process restarts.** With in-process restarts
  (:mod:`elastic_train.agent.inprocess.restarts`) a failed attempt does not stop the group:
  the agent's :class:`~elastic_train.agent.inprocess.controller.InProcessController` watches
  its workers (torch's process context would stop them all at the first death), charges the
  failure, lets the survivors unwind and start the next attempt, and starts a new process
  only in the slot of a worker that died, hung or lost its device. It leaves the failure to
  torch's monitoring when a live worker cannot restart in process (a script without the
  wrapper).
- **Membership changes in process.** When the job's membership changes during an in-process
  restart (a node is gone, gave up or is waiting to join), or a node joins while the workers
  run in process, torch's restart of the group is only its rendezvous: the workers wait in
  their processes, and the new round's ranks, world size, store and generation are handed to
  them (:meth:`~elastic_train.agent.inprocess.controller.InProcessController.reform`); only
  a slot whose process ended gets a new one. Where a rendezvous backend keeps one store for
  every round (static), torch restarts the whole group.
- **Leaving for a spare.** A node asked to leave for a spare (``AgentEvents.leave_request``:
  it is the named straggler) leaves while its group is healthy, once a spare waits
  (:mod:`.leave_for_spare`): its workers are stopped, nothing is charged, and it ends as a
  node its policy sent away (:attr:`TrainAgent.leaving`), keeping the rendezvous open; the
  survivors meet it as a lost node, and the spare takes its ranks.

Everything else -- rendezvous, spawning, monitoring, restart budget,
membership changes, shutdown -- is torch.distributed.elastic's own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import socket
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from torch.distributed.elastic.agent.server.api import (
    DEFAULT_ROLE,
    RunResult,
    WorkerGroup,
    WorkerSpec,
    WorkerState,
)
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

from elastic_train._internal import env_vars
from elastic_train._internal.failure_kinds import FailureKind
from elastic_train._internal.rendezvous_backends import lookup
from elastic_train.agent import forked_workers, torch_compat
from elastic_train.agent.attribution import FailureExchange, NodeReport, at_fault_of, charged
from elastic_train.agent.failures import failures_of, observe
from elastic_train.agent.inprocess.controller import AgentHooks, InProcessController
from elastic_train.agent.inprocess.restarts import Recovery
from elastic_train.agent.leave_for_spare import LeaveForSpare
from elastic_train.agent.no_progress_guard import signature
from elastic_train.agent.node_liveness import Beacon, NodeLiveness
from elastic_train.agent.node_policy import NodeVerdict
from elastic_train.agent.options import AgentEvents, AgentOptions
from elastic_train.agent.rendezvous import gone_nodes, spares, state_poll
from elastic_train.agent.restart_budget import Decision, RestartBudget
from elastic_train.agent.worker_slots import surviving
from elastic_train.errors import WorkerFailure
from elastic_train.worker import preemption

logger = logging.getLogger(__name__)

SEAL_WITHIN_S = 60.0  # how long the survivors of a lost node watch for each other to rejoin


def torch_restarts_left(max_restarts: int, budget: RestartBudget, restart: bool) -> int:
    """What torch's restart counter (``_remaining_restarts``) holds to carry out the
    ``budget``'s decision ``restart``; the budget decides, torch's counter follows it.

    torch restarts a failed group while the counter is positive and takes one off, and
    gives the workers ``max_restarts`` minus the counter as ``TORCHELASTIC_RESTART_COUNT``:
    so the counter is ``max_restarts`` minus the failures charged so far, plus the one
    torch takes off (the workers then count charged restarts); 0 stops the group.
    """
    return max_restarts - budget.failures + 1 if restart else 0


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


class TrainAgent(LocalElasticAgent):
    """A ``LocalElasticAgent`` that namespaces worker generations and reports failures.

    ``options`` says how it runs its workers, ``events`` whom it tells (both built
    by :func:`elastic_train.agent.api.run_agent`); the rest is torch's.
    """

    liveness: NodeLiveness | None = None  # which nodes of the round are known gone

    def __init__(self, *args: Any, options: AgentOptions, events: AgentEvents, **kwargs: Any):
        super().__init__(*args, **torch_compat.agent_options(options.shutdown_timeout),
                         **kwargs)
        self.options, self.events = options, events
        self._in_process = InProcessController(options.in_process, AgentHooks(
            decide=self._decide_in_process, check_hangs=self._check_hangs,
            preempted=self._preempted, recovered=self._recovered, command=self._command,
            membership_changed=self._membership_changed, can_reform=self._store_per_round,
            gone=lambda: self.liveness.gone() if self.liveness is not None else set()),
            options.staging_dir) if options.in_process is not None else None
        self.last_failures: list[WorkerFailure] = []
        self.no_progress: str | None = None
        self.budget = options.budget or RestartBudget(
            max_failures=self.get_worker_group().spec.max_restarts)
        self.preemption_budget_spent = False
        self.leaving: NodeVerdict | None = None  # the node policy sent this node away
        self._swap = LeaveForSpare(events.leave_request, self._spares_waiting) \
            if events.leave_request is not None else None
        self.unkillable: dict[int, str] = {}
        self._rendezvous_count = 0
        self.membership_changes = 0
        self._generation = ""
        self._stopped: set[int] = set()
        self._beacon: Beacon | None = None
        # The root cause on the node at fault for the last failed attempt, when another
        # node is (until the next rendezvous): what this node ends with if the job does.
        self.peer_root: WorkerFailure | None = None

    def _rendezvous(self, worker_group: WorkerGroup) -> None:
        previous = worker_group.group_world_size
        self.options.node.check_admitted()
        if self.liveness is not None and (gone := self.liveness.known_gone()):
            handler = worker_group.spec.rdzv_handler  # torch's would wait for them
            if (left := gone_nodes.forget(handler, gone)) is not None:
                gone_nodes.seal_when_joined(handler, left, worker_group.group_rank or 0,
                                            SEAL_WITHIN_S)
        with state_poll.polling(self.options.rendezvous_poll_s):
            super()._rendezvous(worker_group)
        nodes = worker_group.group_world_size or 1
        if nodes > 1 and self._beacon is None:  # a single node has nobody to lose
            self._beacon = Beacon(worker_group.spec.local_addr or socket.getfqdn())
        self.liveness = None if self._beacon is None else NodeLiveness(
            worker_group.store, worker_group.group_rank or 0, nodes, self._beacon)
        if self.liveness is not None:
            self.liveness.publish()
        self.peer_root = None
        self._rendezvous_count += 1
        if previous is not None and worker_group.group_world_size != previous:
            self.membership_changes += 1
        if self.events.on_rendezvous is not None:
            self.events.on_rendezvous(worker_group.group_rank, worker_group.group_world_size)

    @staticmethod
    def _store_per_round(worker_group: WorkerGroup) -> bool:
        """Whether each rendezvous round of the group's backend has a store of its own."""
        return lookup(worker_group.spec.rdzv_handler.get_backend(),
                      "rdzv_handler").store_per_round

    @staticmethod
    def _membership_changed(worker_group: WorkerGroup) -> bool:
        """Whether the job's nodes must rendezvous again, asked twice a second while the
        agents wait for each other after a failure: a node is waiting to join. A node
        known gone (:attr:`liveness`, asked separately and more often) is the other
        reason; without it the survivors wait ``unwind_timeout_s`` + 5 s for a lost node."""
        return worker_group.spec.rdzv_handler.num_nodes_waiting() > 0

    def _agree_on_generation(self, worker_group: WorkerGroup) -> str:
        # A store prefixed by its round (dynamic rendezvous) needs one key per round
        # (restart counts differ between nodes: free restarts, late joiners). The
        # static store is shared by every round, and there every node re-rendezvouses
        # at each restart, so they count alike.
        key = ("elastic_train/generation/0" if self._store_per_round(worker_group)
               else f"elastic_train/generation/{self._rendezvous_count}")
        store = worker_group.store
        if worker_group.group_rank == 0:
            store.set(key, uuid.uuid4().hex)
        return store.get(key).decode()

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        options = self.options
        generation = self._generation = self._agree_on_generation(worker_group)
        env = {**options.worker_env, env_vars.GENERATION: generation,
               env_vars.AGENT_PID: str(os.getpid())}
        if options.hang_watch is not None:
            options.hang_watch.reset([w.global_rank for w in worker_group.workers])
            env[env_vars.PROGRESS_DIR] = options.hang_watch.progress_dir
        if options.notice_dir is not None:
            preemption.clear(options.notice_dir)
            env[env_vars.PREEMPTION_DIR] = options.notice_dir
            env[env_vars.PREEMPTION_GRACE_S] = str(options.preemption_grace_s)
        if options.worker_pids_dir is not None:
            forked_workers.clear(options.worker_pids_dir)
            env[env_vars.WORKER_PIDS_DIR] = options.worker_pids_dir
        if options.staging_dir is not None:
            shutil.rmtree(options.staging_dir, ignore_errors=True)
        if options.import_watch is not None:
            env[env_vars.MODULES_DIR] = options.import_watch.directory
        if self._in_process is not None:
            env.update(self._in_process.begin(self._restart_count(worker_group.spec)))
        worker_group.spec.entrypoint, worker_group.spec.args = self._command()
        with _environ(env):
            pids = super()._start_workers(worker_group)
        if self._in_process is not None:
            self._in_process.started(self._pcontext, env)
        self._stop_rest_at_once()
        return pids

    def _restart_workers(self, worker_group: WorkerGroup) -> None:
        """torch's restart of the group (stop, rendezvous, start); with the workers parked
        for a new world -- after a failure, or now for a node that joins a running job
        -- the rendezvous alone (membership changes in process, in this module's docstring).
        torch restarts a healthy group only for a node waiting to join (see
        :meth:`_heard_before_restart`)."""
        if worker_group.state == WorkerState.HEALTHY:
            self._heard_before_restart(worker_group)
        if self._in_process is None or not (self._in_process.parked
                                            or self._in_process.park(worker_group)):
            return super()._restart_workers(worker_group)
        self._rendezvous(worker_group)
        generation = self._generation = self._agree_on_generation(worker_group)
        if self.options.staging_dir is not None:  # staged under the old world's ranks
            shutil.rmtree(self.options.staging_dir, ignore_errors=True)
        self._in_process.reform(worker_group, generation,
                                self._restart_count(worker_group.spec))
        worker_group.state = WorkerState.HEALTHY
        return None

    def _heard_before_restart(self, worker_group: WorkerGroup) -> None:
        """A healthy group restarts for a node waiting to join: the caller hears of the
        join (``on_join``) -- or, when another node told a failed attempt of this
        generation (its workers failed and it went on to the rendezvous before this
        node's workers saw it), of that failure (``on_failure``: none of this node's
        workers, a peer's decision that charges nothing, the root cause there)."""
        told = FailureExchange(worker_group.store, self._generation).told(
            worker_group.group_world_size or 1, worker_group.group_rank or 0)
        if told and self.events.on_failure is not None:
            decision = Decision(FailureKind.PEER, True, self.budget.restarts_left)
            self.events.on_failure([], decision, at_fault_of(told).root)
        elif not told and self.events.on_join is not None:
            self.events.on_join()

    def _command(self) -> tuple[str, tuple[str, ...]]:
        """The worker command now: asked for again at every start and replacement (e.g. a
        new zygote if the last one died: a live zygote at every start), else the spec's."""
        if self.options.worker_command is not None:
            return self.options.worker_command()
        spec = self.get_worker_group().spec
        return spec.entrypoint, spec.args

    def _stop_rest_at_once(self) -> None:
        """Makes the stop of the rest of the group that torch's process context does on
        the first failure a SIGKILL (it sends SIGTERM and waits 30 s), and notes whom
        it stops: they did not fail (see SIGKILL stops)."""
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
        result = self._look(worker_group)
        if result.state == WorkerState.HEALTHY and self._swap is not None \
                and (verdict := self._swap.verdict()) is not None:
            return self._leave_for_spare(verdict)
        return result

    def _look(self, worker_group: WorkerGroup) -> RunResult:
        """The group's state: the in-process controller's, else torch's (a failure
        decided on, hung workers stopped)."""
        if self._in_process is not None and (
                seen := self._in_process.watch(worker_group)) is not None:
            return seen
        result = super()._monitor_workers(worker_group)
        if result.state == WorkerState.HEALTHY:
            self._check_hangs(worker_group)
        if result.is_failed():
            result.failures = {rank: failure for rank, failure in result.failures.items()
                               if failure.pid not in self._stopped} or result.failures
            self._decide(worker_group, failures_of(result), self._classify(worker_group, result))
        return result

    def _spares_waiting(self) -> int:
        return spares.waiting(self.get_worker_group().spec.rdzv_handler)

    def _leave_for_spare(self, verdict: NodeVerdict) -> RunResult:
        """This node leaves a healthy group for a spare (leaving for a spare): torch stops the
        workers (no restart is left), nothing is charged, and the run ends failed with
        no failure of its own, as a node its policy sent away."""
        logger.warning("This node leaves the job (%s); a spare takes its place.",
                       verdict.reason)
        self.leaving, self.last_failures, self.no_progress = verdict, [], None
        self._follow_budget(self.get_worker_group().spec, restart=False)
        return RunResult(state=WorkerState.FAILED)

    def _check_hangs(self, worker_group: WorkerGroup) -> None:
        """Stops hung workers (they show up as failures at the next look); hands the
        modules the workers imported to the zygote once they are reported."""
        if self.options.import_watch is not None:
            self.options.import_watch.poll()
        if self.options.hang_watch is not None and self._pcontext is not None:
            pids = self._pcontext.pids()
            self.options.hang_watch.check({
                w.global_rank: (pids[w.local_rank], self._pcontext.error_files[w.local_rank])
                for w in worker_group.workers if w.local_rank in pids})

    def _decide(self, worker_group: WorkerGroup, failures: list[WorkerFailure],
                kind: FailureKind) -> Decision:
        """Charges a failed attempt to its budget, asks the node policy whether this node
        stays (a node sent away stops its group alone), and reports the decision."""
        progress = self.events.progress() if self.events.progress is not None else None
        decision = self.budget.charge(kind, progress, signature(failures[0]),
                                      config_error=failures[0].config_error)
        verdict = self.options.node.after_failure(kind, failures)
        if verdict.leave and decision.restart:  # a run that stops anyway closes the job
            decision = dataclasses.replace(decision, restart=False, leave=verdict)
            self.leaving = verdict
        self.preemption_budget_spent = decision.preemption_budget_spent
        self.last_failures, self.no_progress = failures, decision.no_progress
        self._follow_budget(worker_group.spec, decision.restart)
        if self.events.on_failure is not None:
            cause = self.peer_root if kind is FailureKind.PEER else None
            self.events.on_failure(failures, decision, cause)
        return decision

    def _follow_budget(self, spec: WorkerSpec, restart: bool) -> None:
        """Sets torch's restart counter to carry out ``restart`` (see
        :func:`torch_restarts_left`): the one place it is written."""
        self._remaining_restarts = torch_restarts_left(spec.max_restarts, self.budget, restart)

    def _restart_count(self, spec: WorkerSpec) -> int:
        """The workers' ``TORCHELASTIC_RESTART_COUNT``, as torch computes it from its
        counter: the base the in-process attempts count from."""
        return spec.max_restarts - self._remaining_restarts

    def _decide_in_process(self, worker_group: WorkerGroup, failures: list[WorkerFailure],
                           kind: FailureKind, peer_root: WorkerFailure | None) -> Decision:
        """:meth:`_decide` for an in-process restart, which settled who is at fault itself."""
        self.peer_root = peer_root
        return self._decide(worker_group, failures, kind)

    def _recovered(self, worker_group: WorkerGroup, recovery: Recovery) -> None:
        """After an in-process restart: the next attempt starts with a fresh hang watch
        and no preemption notice, and the caller hears of it."""
        if self.options.hang_watch is not None:
            self.options.hang_watch.reset([w.global_rank for w in worker_group.workers])
        if self.options.notice_dir is not None:
            preemption.clear(self.options.notice_dir)
        if self.events.on_recovered is not None:
            self.events.on_recovered(recovery)

    def _classify(self, worker_group: WorkerGroup, result: RunResult) -> FailureKind:
        """Which budget the failed attempt spends (see :mod:`.restart_budget`)."""
        if self._preempted():
            return FailureKind.PREEMPTION
        nodes = worker_group.group_world_size or 1
        if nodes == 1:
            return FailureKind.FAILURE
        exchange = FailureExchange(worker_group.store, self._generation)
        mine = exchange.announce(NodeReport.of(worker_group.group_rank, observe(result)))
        liveness = self.liveness
        others = exchange.share(mine, nodes, liveness.gone if liveness is not None else None)
        at_fault = charged(mine, others, nodes,
                           liveness.gone() if liveness is not None else ())
        if at_fault is mine:
            return FailureKind.FAILURE
        self.peer_root = at_fault.root if at_fault is not None else None
        return FailureKind.PEER

    def _preempted(self) -> bool:
        notice_dir = self.options.notice_dir
        return notice_dir is not None and preemption.marked(notice_dir)

    def run(self, role: str = DEFAULT_ROLE) -> RunResult:
        """torch's run; then this agent's beacon closes (see :mod:`.node_liveness`)."""
        try:
            return super().run(role)
        finally:
            if self._beacon is not None:
                self._beacon.close()

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
        pids_dir = self.options.worker_pids_dir
        forked = forked_workers.behind(pids_dir, pids) if pids_dir is not None else {}
        timeout = self.options.shutdown_timeout if timeout is None else timeout
        torch_compat.shutdown(super()._shutdown, self._pcontext, death_sig, timeout)
        forked_workers.kill(forked)
        self.unkillable = surviving([*pids, *forked], wait_s=max(1.0, timeout))
        for pid, state in self.unkillable.items():
            logger.error("Worker pid %d could not be killed (process state %s, e.g. stuck in "
                         "uninterruptible I/O); it is left behind.", pid, state)
