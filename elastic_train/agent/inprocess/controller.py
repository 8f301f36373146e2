"""The agent's part of in-process restarts: an object the agent owns ("in-process restarts" of
:mod:`elastic_train.agent.local_agent`).

:class:`InProcessController` watches the workers before torch's monitoring does
(which would stop them all at the first death) and carries a failed attempt
through named states (:class:`RestartState`), as torch's rendezvous turns each
step into an ``_Action`` and Ray Train v2's controller has one state per step::

    RUNNING --failure seen--> INTERRUPTED --> DECIDING --restart--> RECOVERING --> RUNNING
       |                                         |                     |              ^
       |                                         +--budget spent--> GAVE_UP           |
       |                                                  membership changed          |
       |                                                               +--> PARKED --reform
       +--a node joins (park)----------------------------------------------^
                                                                       +--cannot--> FELL_BACK

When the job's membership changes during a restart (a node is gone, gave up or is
joining), or a node joins while the attempt runs (:meth:`~InProcessController.park`),
the local workers wait ``PARKED`` while the agent runs a new rendezvous
round; :meth:`~InProcessController.reform` then hands them their ranks in the new
world. Only when that is not possible (a rendezvous backend whose store outlives its
rounds) does torch restart the group in new processes (``FELL_BACK``).

The steps over the workers' records are :class:`~.restarts.InProcessRestarts`';
what it needs from its agent -- the budget's decision, the hang check, whether a
preemption notice came, what to do once recovered, the worker command -- is
handed over at construction as :class:`AgentHooks`, so it reads none of the
agent's attributes. The agent hands it the process context after each start
(:meth:`~InProcessController.started`).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.distributed.elastic.agent.server.api import RunResult, Worker, WorkerGroup, WorkerState
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
from torch.distributed.elastic.utils import macros

from elastic_train._internal import env_vars
from elastic_train._internal.failure_kinds import FailureKind
from elastic_train.agent.failures import Observed, observe
from elastic_train.agent.inprocess.restarts import (
    FailedAttempt,
    InProcessRestarts,
    InProcessSettings,
    Recovery,
    Seen,
)
from elastic_train.agent.node_liveness import nobody
from elastic_train.agent.restart_budget import Decision
from elastic_train.agent.worker_slots import replace_worker
from elastic_train.errors import WorkerFailure
from elastic_train.storage.uploader import discard_staged
from elastic_train.worker.inprocess.channel import NewWorld

logger = logging.getLogger(__name__)


class RestartState(enum.Enum):
    """Where this node's in-process restart stands (:attr:`InProcessController.state`)."""

    IDLE = "idle"  # no group started yet, or torch's monitoring decides (see Seen.TORCH)
    RUNNING = "running"  # the attempt runs, and every live worker can restart in process
    INTERRUPTED = "interrupted"  # a failure was announced; local workers told to abort
    DECIDING = "deciding"  # the restart budget is charged for the failed attempt
    RECOVERING = "recovering"  # survivors unwind, dead slots refilled, nodes agree
    GAVE_UP = "gave up"  # the budget is spent: the group stops
    PARKED = "parked"  # membership changed: the workers wait for the next round's ranks
    FELL_BACK = "fell back"  # no in-process restart possible: torch restarts the group


@dataclass(frozen=True)
class AgentHooks:
    """What the controller needs from its agent, and nothing more.

    Attributes:
        decide: ``(group, failures, kind, peer_root)`` -> the budget's decision for a
            failed attempt (``peer_root``: the root cause on the node at fault when
            it is another, else None); it is reported as any failure is.
        check_hangs: Stops hung workers of a running group.
        preempted: Whether a preemption notice came (the failure spends that budget).
        recovered: ``(group, recovery)`` after an in-process restart.
        command: The worker command now (``entrypoint, args``; a new zygote if the
            last one died), for a replacement process.
        gone: The group ranks of the current round known gone
            (:class:`~elastic_train.agent.node_liveness.NodeLiveness`).
        membership_changed: Whether the job's nodes must rendezvous again (a node is
            waiting to join), asked while the agents wait for each other.
        can_reform: Whether the workers can wait through a new rendezvous round (its
            store is new, so attempts can count from 0 again).
    """

    decide: Callable[[WorkerGroup, list[WorkerFailure], FailureKind, WorkerFailure | None],
                     Decision]
    check_hangs: Callable[[WorkerGroup], None]
    preempted: Callable[[], bool]
    recovered: Callable[[WorkerGroup, Recovery], None]
    command: Callable[[], tuple[str, tuple[str, ...]]]
    membership_changed: Callable[[WorkerGroup], bool]
    can_reform: Callable[[WorkerGroup], bool]
    gone: Callable[[], set[int]] = nobody


class InProcessController:
    """One node's in-process restarts, as its agent's monitoring carries them out.

    ``staging_dir``: where the workers stage checkpoint files (a dead rank's are
    discarded before its replacement starts); None when nothing is staged.
    """

    def __init__(self, settings: InProcessSettings, hooks: AgentHooks,
                 staging_dir: str | None = None):
        self._hooks = hooks
        self._staging_dir = staging_dir
        self.restarts = InProcessRestarts(settings.directory, settings.unwind_timeout_s,
                                          self._replace, self._failure_of, hooks.gone)
        self.state = RestartState.IDLE
        self._processes: Any = None  # torch's process context of the running group
        self._env: dict[str, str] = {}

    def _enter(self, state: RestartState) -> None:
        if state is not self.state:
            logger.debug("In-process restart: %s -> %s", self.state.value, state.value)
        self.state = state

    def begin(self, restart_count: int) -> dict[str, str]:
        """A new group of processes is about to start; returns what to add to the
        workers' environment."""
        self._enter(RestartState.IDLE)
        return self.restarts.begin(restart_count)

    def started(self, processes: Any, env: dict[str, str]) -> None:
        """The group started: torch's process context, and the environment its workers
        got (a replacement gets the same)."""
        self._processes, self._env = processes, env

    def watch(self, group: WorkerGroup) -> RunResult | None:
        """The group's state when in-process restarts decide it; None when torch's own
        monitoring must (the group finished, or a worker cannot restart in process)."""
        if self._processes is None:
            return None
        look = self.restarts.poll(group, self._processes)
        if look.seen is Seen.FAILED:
            assert look.failed is not None
            return self._restart(group, look.failed)
        if look.seen is Seen.RUNNING:  # able to restart in process: torch must not stop them
            self._enter(RestartState.RUNNING)
            self._hooks.check_hangs(group)
            return RunResult(state=WorkerState.HEALTHY)
        self._enter(RestartState.IDLE)
        return None

    def _restart(self, group: WorkerGroup, failed: FailedAttempt) -> RunResult:
        """Charges the failed attempt and runs the next one in the same processes; falls
        back to a restart of the whole group (torch's) when that is not possible."""
        own = self.restarts.interrupt(group, failed)
        self._enter(RestartState.INTERRUPTED)
        root = failed.root
        assert root is not None  # a failed look found a failure, here or on another node
        failures = failed.failures or [root]
        kind = FailureKind.PREEMPTION if self._hooks.preempted() else (
            FailureKind.FAILURE if own else FailureKind.PEER)
        self._enter(RestartState.DECIDING)
        decision = self._hooks.decide(group, failures, kind,
                                      None if own else failed.remote_root)
        if not decision.restart:
            self._enter(RestartState.GAVE_UP)
            self.restarts.give_up(group, self._processes)
            return RunResult(state=WorkerState.FAILED)
        self._enter(RestartState.RECOVERING)
        recovery = self.restarts.recover(group, self._processes, failed,
                                         lambda: self._hooks.membership_changed(group))
        if recovery is None:  # torch's restart follows: its rendezvous, then reform()
            if self._hooks.can_reform(group):
                self._enter(RestartState.PARKED)
                logger.warning("The job's nodes changed; its workers wait for their new "
                               "ranks in their processes.")
            else:
                self._enter(RestartState.FELL_BACK)
                logger.warning("The group could not restart in process; its workers "
                               "restart as new processes.")
            return RunResult(state=WorkerState.FAILED)
        self._hooks.recovered(group, recovery)
        self._enter(RestartState.RUNNING)
        return RunResult(state=WorkerState.HEALTHY)

    def park(self, group: WorkerGroup) -> bool:
        """A node waits to join the running job (torch restarts the group for it): the
        local workers leave the attempt in their processes and wait ``PARKED`` for their
        ranks in the new world, as after a failure that changed the membership. False
        (nothing done) when they cannot: the attempt is not running in process, or the
        backend's store outlives its rounds."""
        if self.state is not RestartState.RUNNING or not self._hooks.can_reform(group):
            return False
        left = self.restarts.leave(group, self._processes)
        if left.replaced:
            logger.warning("Rank(s) %s did not leave the attempt for the joining node in "
                           "time; new processes take their places.", sorted(left.replaced))
        self._enter(RestartState.PARKED)
        logger.warning("A node joins the job; its workers wait for their new ranks in their "
                       "processes.")
        return True

    @property
    def parked(self) -> bool:
        """Whether the workers wait for their ranks in a new world (see :meth:`reform`)."""
        return self.state is RestartState.PARKED

    def reform(self, group: WorkerGroup, generation: str, restart_count: int) -> None:
        """After the agent's new rendezvous round (``group`` holds its ranks, store and
        master address; ``generation`` its agreed id): the parked workers take their place
        in the new world in their processes and start its attempt 0."""
        first = group.workers[0]
        world = NewWorld(generation, group.group_rank, group.group_world_size,
                         first.global_rank, first.world_size, first.role_rank,
                         first.role_world_size, group.master_addr)
        self._env = {**self._env, env_vars.GENERATION: generation}  # for later replacements
        recovery = self.restarts.reform(group, self._processes, world, restart_count)
        pids = self._processes.pids()
        for worker in group.workers:  # torch's monitoring compares them with its own
            worker.id = pids[worker.local_rank]
        self._hooks.recovered(group, recovery)
        self._enter(RestartState.RUNNING)

    def _replace(self, worker: Worker, env: dict[str, str]) -> int:
        """A new process in ``worker``'s slot (an in-process restart's dead or killed rank)."""
        entrypoint, args = self._hooks.command()
        args = tuple(macros.substitute(list(args), str(worker.local_rank)))
        if self._staging_dir is not None:  # what the dead rank staged is stale
            discard_staged(self._staging_dir, worker.global_rank)
        return replace_worker(self._processes, worker, entrypoint, args, {**self._env, **env})

    def _failure_of(self, worker: Worker, exitcode: int) -> Observed:
        """A dead worker, described from its exit and its error file (as torch would)."""
        failure = ProcessFailure(local_rank=worker.local_rank, pid=worker.id or 0,
                                 exitcode=exitcode,
                                 error_file=self._processes.error_files[worker.local_rank])
        return observe(RunResult(WorkerState.FAILED, failures={worker.global_rank: failure}))[0]
