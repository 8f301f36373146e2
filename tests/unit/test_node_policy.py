"""The node policy seam: its default, its loading, what the agent makes of a verdict,
and our etcd handler's sealer leaving out a node the policy does not admit."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from elastic_train._internal.failure_kinds import FailureKind
from elastic_train.agent import node_policy
from elastic_train.agent.local_agent import TrainAgent
from elastic_train.agent.node_policy import (
    ADMITTED,
    STAY,
    Candidate,
    ChargedFailures,
    NodePolicy,
    NodeStanding,
    leave,
)
from elastic_train.agent.options import AgentEvents, AgentOptions
from elastic_train.agent.restart_budget import RestartBudget
from elastic_train.errors import ConfigError, NodeLeftError, WorkerFailure
from tests.support.memory_etcd import sealed_with_a_second_joiner
from tests.support.node_policies import ADMITTED_VARIABLE, AdmitListed, LeaveAfterTwoInARow

FAILURE = WorkerFailure(rank=0, local_rank=0, pid=1, exitcode=1, message="boom", traceback=None)


def test_the_default_admits_everyone_and_keeps_every_node():
    policy = node_policy.load(None)
    assert type(policy) is NodePolicy
    assert policy.admit(Candidate("node0")) is ADMITTED
    charged = ChargedFailures("node0", FailureKind.FAILURE, (FAILURE,), charged=9, in_a_row=9)
    assert policy.after_failure(charged) is STAY


def test_a_policy_is_loaded_by_its_dotted_path_or_passed_as_it_is():
    loaded = node_policy.load("tests.support.node_policies:AdmitListed")
    assert isinstance(loaded, AdmitListed)
    assert node_policy.load(loaded) is loaded


@pytest.mark.parametrize("path", ["tests.support.node_policies:Missing", "no_such_module:X",
                                  "tests.support.node_policies", "tests.support.node_policies:os"])
def test_a_bad_policy_path_names_the_setting(path):
    with pytest.raises(ConfigError, match="node_policy=") as raised:
        node_policy.load(path)
    assert raised.value.field == "node_policy"


def test_a_verdict_and_a_refusal_need_a_reason():
    with pytest.raises(ValueError):
        leave("")
    with pytest.raises(ValueError):
        node_policy.refused("")


def test_the_standing_counts_failures_in_a_row_and_a_peers_failure_breaks_the_row():
    seen: list[ChargedFailures] = []

    class Recording(NodePolicy):
        def after_failure(self, charged):
            seen.append(charged)
            return STAY

    standing = NodeStanding(Recording(), "node0")
    for kind in (FailureKind.FAILURE, FailureKind.FAILURE, FailureKind.PEER,
                 FailureKind.FAILURE):
        standing.after_failure(kind, [FAILURE])
    assert [(c.kind, c.charged, c.in_a_row) for c in seen] == [
        (FailureKind.FAILURE, 1, 1), (FailureKind.FAILURE, 2, 2), (FailureKind.PEER, 2, 0),
        (FailureKind.FAILURE, 3, 1)]
    assert seen[0].node == "node0" and seen[0].failures == (FAILURE,)


def test_a_node_not_admitted_leaves_with_its_name_and_the_reason(monkeypatch):
    monkeypatch.setenv(ADMITTED_VARIABLE, "node0")
    NodeStanding(AdmitListed(), "node0").check_admitted()
    with pytest.raises(NodeLeftError) as raised:
        NodeStanding(AdmitListed(), "node1").check_admitted()
    assert raised.value.node == "node1"
    assert "Node node1 left the job: not admitted: node1 is not on the test's list" \
        in str(raised.value)


def test_the_agent_turns_a_leave_verdict_into_a_stop_of_this_node_alone():
    """Two failures in a row charged to this node: the budget would restart, the policy
    sends the node away; the decision says so, and the caller hears it."""
    decisions = []
    agent = TrainAgent.__new__(TrainAgent)  # only the decision is exercised
    agent.options = AgentOptions(node=NodeStanding(LeaveAfterTwoInARow(), "node0"))
    agent.events = AgentEvents(on_failure=lambda failures, decision, cause:
                               decisions.append(decision))
    agent.budget, agent.peer_root, agent.leaving = RestartBudget(max_failures=-1), None, None
    group = SimpleNamespace(spec=SimpleNamespace(max_restarts=10))
    for _ in range(2):
        agent._decide(group, [FAILURE], FailureKind.FAILURE)
    first, second = decisions
    assert first.restart and first.leave is None
    assert not second.restart and second.leave == leave("2 failures in a row", 60)
    assert agent.leaving == second.leave and agent._remaining_restarts == 0


def test_the_message_names_the_node_the_reason_and_the_cool_off():
    message = str(NodeLeftError("node7", "2 failures in a row", cool_off_s=600))
    assert message.startswith("Node node7 left the job: 2 failures in a row.")
    assert "It is not admitted again for 600 s of cooling off, even if its agent is started " \
           "again." in message
    assert "cooling off" not in str(NodeLeftError("node7", "2 failures in a row"))


def test_the_sealer_admits_every_node_by_default():
    info, _, _, _ = sealed_with_a_second_joiner(None)
    assert info.world_size == 2


def test_the_sealer_leaves_out_a_node_its_policy_refuses_and_that_node_learns_why(
        monkeypatch):
    monkeypatch.setenv(ADMITTED_VARIABLE, "127.0.0.1")
    info, keys, other, kv = sealed_with_a_second_joiner(
        "tests.support.node_policies:AdmitListed")
    assert (info.rank, info.world_size) == (0, 1)
    assert kv.data[keys.refused(0, other._node)].value == b"10.0.0.2 is not on the test's list"
    with pytest.raises(NodeLeftError) as raised:  # its own (default) policy admits it
        other.next_rendezvous()
    assert raised.value.node == "10.0.0.2"
    assert "not admitted by the sealer of round 0: 10.0.0.2 is not on the test's list" \
        in str(raised.value)
