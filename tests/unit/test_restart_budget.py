"""Unit tests: the failure policy decides restarts from the kind of failure alone."""

from __future__ import annotations

import pytest

from elastic_train._internal.failure_kinds import FailureKind
from elastic_train.agent.restart_budget import UNLIMITED, RestartBudget

FAILURE, PEER, PREEMPTION = FailureKind.FAILURE, FailureKind.PEER, FailureKind.PREEMPTION


@pytest.mark.parametrize("max_failures,restarts", [(0, 0), (1, 1), (3, 3)])
def test_failures_restart_exactly_max_failures_times(max_failures, restarts):
    budget = RestartBudget(max_failures=max_failures)
    decisions = [budget.charge(FAILURE) for _ in range(restarts + 1)]
    assert [d.restart for d in decisions] == [True] * restarts + [False]
    assert [d.restarts_left for d in decisions] == [*range(restarts - 1, -1, -1), 0]


def test_unlimited_never_stops():
    budget = RestartBudget(max_failures=UNLIMITED, max_preemptions=UNLIMITED)
    for kind in (FAILURE, PREEMPTION) * 50:
        decision = budget.charge(kind)
        assert decision.restart and decision.restarts_left == UNLIMITED


def test_peer_failures_are_free_and_leave_the_budget_as_it_was():
    budget = RestartBudget(max_failures=1)
    assert all(budget.charge(PEER).restart for _ in range(10))
    assert budget.charge(PEER).restarts_left == 1
    assert budget.charge(FAILURE).restart
    assert not budget.charge(FAILURE).restart
    assert (budget.failures, budget.peer_failures) == (2, 11)


def test_preemptions_spend_their_own_budget_not_max_failures():
    budget = RestartBudget(max_failures=0, max_preemptions=2)
    assert [budget.charge(PREEMPTION).restart for _ in range(3)] == [True, True, False]
    assert budget.failures == 0
    spent = RestartBudget(max_failures=5, max_preemptions=0).charge(PREEMPTION)
    assert not spent.restart and spent.preemption_budget_spent
    assert not RestartBudget(max_failures=0).charge(FAILURE).preemption_budget_spent
