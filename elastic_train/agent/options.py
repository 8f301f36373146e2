"""What a :class:`~elastic_train.agent.local_agent.TrainAgent` is given beyond torch's
``WorkerSpec``: its options (:class:`AgentOptions`) and the callbacks that tell its
caller what happens (:class:`AgentEvents`).

Both are built in one place, :func:`elastic_train.agent.api.run_agent`, from the
node's :class:`~elastic_train.agent.api.AgentSpec`; grouping them keeps the agent's
constructor to torch's arguments plus these two.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from elastic_train.agent.hang_watch import HangWatch
from elastic_train.agent.inprocess.restarts import InProcessSettings, Recovery
from elastic_train.agent.no_progress_guard import Progress
from elastic_train.agent.node_policy import NodePolicy, NodeStanding, NodeVerdict, node_name
from elastic_train.agent.restart_budget import Decision, RestartBudget
from elastic_train.agent.zygote.preload import ImportWatch
from elastic_train.errors import WorkerFailure

WorkerCommand = Callable[[], tuple[str, tuple[str, ...]]]


@dataclass(frozen=True)
class AgentOptions:
    """How one node's agent runs its workers. Frozen: the agent never swaps an option;
    ``budget`` and ``node`` are objects it asks, which count what happened.

    Attributes:
        worker_env: Added to every worker's environment.
        budget: Decides whether a failed group restarts (default: torch's
            ``max_restarts`` as the failure budget).
        shutdown_timeout: Seconds from the stop signal to SIGKILL at shutdown.
        preemption_grace_s: How long workers get after a preemption notice.
        notice_dir: Where workers leave preemption notices (None: not watched).
        hang_watch: Stops workers that stop reporting progress (None: off).
        worker_command: The worker command, asked for at every start (a new zygote
            when the last one died); None: the ``WorkerSpec``'s.
        worker_pids_dir: Where forked workers note their pids (None: none are forked).
        staging_dir: Where workers stage checkpoint files, emptied before each start.
        in_process: In-process restarts (None: a failed group restarts as new processes).
        import_watch: Hands the modules the workers import to the zygote.
        node: This node's standing with its node policy (:mod:`.node_policy`), asked
            after each failure and before each round (default: stays, admitted).
        rendezvous_poll_s: The pause between reads of torch's dynamic handler while
            this agent waits in a round (:mod:`.rendezvous.state_poll`; torch's: 1 s).
    """

    worker_env: Mapping[str, str] = field(default_factory=dict)
    budget: RestartBudget | None = None
    shutdown_timeout: int = 30
    preemption_grace_s: float = 0.0
    notice_dir: str | None = None
    hang_watch: HangWatch | None = None
    worker_command: WorkerCommand | None = None
    worker_pids_dir: str | None = None
    staging_dir: str | None = None
    in_process: InProcessSettings | None = None
    import_watch: ImportWatch | None = None
    node: NodeStanding = field(default_factory=lambda: NodeStanding(NodePolicy(),
                                                                    node_name(None)))
    rendezvous_poll_s: float = 1.0


@dataclass
class AgentEvents:
    """What the agent tells its caller while it runs.

    ``on_failure(failures, decision, cause)``: every failed attempt, including the last:
    this node's failed workers (root cause first), what the restart budget decided (see
    :mod:`.restart_budget`) and, when another node is at fault, the root cause on that
    node (else None).
    ``on_rendezvous(group_rank, nodes)``: after every rendezvous.
    ``on_recovered(recovery)``: after every in-process restart (see :mod:`.inprocess`).
    ``on_join()``: a node waits to join the running job, so the group forms again
    (nothing failed); before that rendezvous.
    ``progress()``: how far the run is, for the no-progress guard (None: unknown).
    ``leave_request()``: whether this node is asked to leave the running job for a spare
    (a node named a straggler, see :mod:`elastic_train.stragglers`): the verdict to leave
    with, or None; asked at each look at a healthy group (:mod:`.leave_for_spare`).
    """

    on_failure: Callable[[list[WorkerFailure], Decision, WorkerFailure | None], None] \
        | None = None
    on_rendezvous: Callable[[int, int], None] | None = None
    on_recovered: Callable[[Recovery], None] | None = None
    on_join: Callable[[], None] | None = None
    progress: Callable[[], Progress | None] | None = None
    leave_request: Callable[[], NodeVerdict | None] | None = None
