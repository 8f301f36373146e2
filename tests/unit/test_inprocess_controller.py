"""Unit tests: the agent's part of in-process restarts walks its named states and asks
its agent only through the hooks (the steps over the workers are stood in for)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
from torch.distributed.elastic.agent.server.api import WorkerState

from elastic_train._internal.failure_kinds import FailureKind
from elastic_train.agent.inprocess.controller import AgentHooks, InProcessController, RestartState
from elastic_train.agent.inprocess.restarts import (
    FailedAttempt,
    InProcessSettings,
    Look,
    Recovery,
    Seen,
)
from elastic_train.agent.restart_budget import Decision
from elastic_train.errors import WorkerFailure


def failure(rank: int) -> WorkerFailure:
    return WorkerFailure(rank=rank, local_rank=rank, pid=100 + rank, exitcode=1,
                         message="RuntimeError: x", traceback=None)


@dataclass
class Steps:
    """Stands in for InProcessRestarts: what ``poll`` sees and how recovery goes."""

    look: Look
    own: bool = True
    recovery: Recovery | None = field(default_factory=lambda: Recovery(1))
    gave_up: bool = False
    reformed: list = field(default_factory=list)

    def poll(self, group, processes) -> Look:
        return self.look

    def interrupt(self, group, failed) -> bool:
        return self.own

    def give_up(self, group, processes) -> None:
        self.gave_up = True

    def leave(self, group, processes) -> Recovery:
        self.left = True
        return Recovery(1)

    def recover(self, group, processes, failed, membership_changed) -> Recovery | None:
        return self.recovery

    def reform(self, group, processes, world, restart_count) -> Recovery:
        self.reformed.append((world, restart_count))
        return Recovery(0, {1: "its process ended"})


@dataclass
class Agent:
    """The hooks' side: records what the controller asked."""

    restart: bool = True
    preempted: bool = False
    decided: list[tuple[FailureKind, WorkerFailure | None]] = field(default_factory=list)
    recovered: list[Recovery] = field(default_factory=list)
    hang_checks: int = 0
    can_reform: bool = False

    def hooks(self) -> AgentHooks:
        def decide(group, failures, kind, peer_root) -> Decision:
            self.decided.append((kind, peer_root))
            return Decision(kind, self.restart, 0)

        def check_hangs(group) -> None:
            self.hang_checks += 1

        return AgentHooks(decide=decide, check_hangs=check_hangs,
                          preempted=lambda: self.preempted,
                          recovered=lambda group, recovery: self.recovered.append(recovery),
                          command=lambda: ("python", ()),
                          membership_changed=lambda group: False,
                          can_reform=lambda group: self.can_reform)


@pytest.fixture
def agent() -> Agent:
    return Agent()


def controller(tmp_path, agent: Agent, steps: Steps) -> InProcessController:
    made = InProcessController(InProcessSettings(str(tmp_path), 1.0), agent.hooks())
    made.begin(restart_count=0)
    made.started(processes=object(), env={})
    made.restarts = steps  # type: ignore[assignment]
    return made


GROUP = SimpleNamespace(spec=SimpleNamespace(rdzv_handler=None))
FAILED = Look(Seen.FAILED, FailedAttempt(0, [failure(1)], primary=True))


def test_nothing_is_watched_before_the_group_starts(tmp_path, agent):
    made = InProcessController(InProcessSettings(str(tmp_path), 1.0), agent.hooks())
    assert made.watch(GROUP) is None and made.state is RestartState.IDLE


def test_a_running_attempt_is_healthy_and_checked_for_hangs(tmp_path, agent):
    made = controller(tmp_path, agent, Steps(Look(Seen.RUNNING)))
    assert made.watch(GROUP).state is WorkerState.HEALTHY
    assert made.state is RestartState.RUNNING and agent.hang_checks == 1


def test_torchs_monitoring_decides_what_cannot_restart_in_process(tmp_path, agent):
    made = controller(tmp_path, agent, Steps(Look(Seen.TORCH)))
    assert made.watch(GROUP) is None and made.state is RestartState.IDLE


def test_an_own_failure_is_charged_and_the_group_recovers_in_process(tmp_path, agent):
    made = controller(tmp_path, agent, Steps(FAILED))
    assert made.watch(GROUP).state is WorkerState.HEALTHY
    assert agent.decided == [(FailureKind.FAILURE, None)]
    assert agent.recovered == [Recovery(1)] and made.state is RestartState.RUNNING


def test_a_peers_failure_is_free_and_names_the_peers_root_cause(tmp_path, agent):
    remote = failure(7)
    steps = Steps(Look(Seen.FAILED, FailedAttempt(0, [], primary=False, remote_root=remote)),
                  own=False)
    controller(tmp_path, agent, steps).watch(GROUP)
    assert agent.decided == [(FailureKind.PEER, remote)]


def test_a_preemption_spends_its_own_budget(tmp_path, agent):
    agent.preempted = True
    controller(tmp_path, agent, Steps(FAILED)).watch(GROUP)
    assert agent.decided == [(FailureKind.PREEMPTION, None)]


def test_a_spent_budget_gives_up(tmp_path, agent):
    agent.restart = False
    steps = Steps(FAILED)
    made = controller(tmp_path, agent, steps)
    assert made.watch(GROUP).state is WorkerState.FAILED
    assert made.state is RestartState.GAVE_UP and steps.gave_up and agent.recovered == []


def test_a_group_that_cannot_recover_falls_back_to_new_processes(tmp_path, agent):
    made = controller(tmp_path, agent, Steps(FAILED, recovery=None))
    assert made.watch(GROUP).state is WorkerState.FAILED
    assert made.state is RestartState.FELL_BACK and agent.recovered == []


def test_a_changed_membership_parks_the_workers_for_their_new_ranks(tmp_path, agent):
    agent.can_reform = True
    steps = Steps(FAILED, recovery=None)
    made = controller(tmp_path, agent, steps)
    assert made.watch(GROUP).state is WorkerState.FAILED  # torch's restart: a rendezvous
    assert made.parked and made.state is RestartState.PARKED and agent.recovered == []

    made._processes = SimpleNamespace(pids=lambda: {0: 500, 1: 501})
    workers = [SimpleNamespace(local_rank=lr, global_rank=2 + lr, role_rank=2 + lr,
                               world_size=4, role_world_size=4, id=None) for lr in (0, 1)]
    group = SimpleNamespace(workers=workers, group_rank=1, group_world_size=2,
                            master_addr="node0")
    made.reform(group, "gen2", restart_count=1)
    [(world, count)] = steps.reformed
    assert count == 1 and world.generation == "gen2" and world.environ(1)["RANK"] == "3"
    assert world.environ(0)["GROUP_RANK"] == "1" and world.environ(0)["WORLD_SIZE"] == "4"
    assert [w.id for w in workers] == [500, 501]  # what torch's monitoring compares
    assert agent.recovered == [Recovery(0, {1: "its process ended"})]
    assert made.state is RestartState.RUNNING and not made.parked


def test_a_joining_node_parks_a_running_attempt_only(tmp_path, agent):
    """torch restarts the group for a node that joins: a running in-process attempt parks
    (the workers leave it in their processes); one that cannot reform, or is not running
    in process, is left to torch's restart."""
    made = controller(tmp_path, agent, Steps(Look(Seen.RUNNING)))
    made.watch(GROUP)
    assert not made.park(GROUP) and made.state is RestartState.RUNNING  # cannot reform
    agent.can_reform = True
    assert made.park(GROUP) and made.state is RestartState.PARKED and made.restarts.left
    idle = controller(tmp_path, agent, Steps(Look(Seen.TORCH)))
    idle.watch(GROUP)
    assert not idle.park(GROUP) and idle.state is RestartState.IDLE
