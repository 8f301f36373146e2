"""Unit tests: the failure policy decides restarts from the kind of failure alone."""

from __future__ import annotations

import pytest

from elastic_train._internal.failure_kinds import FailureKind
from elastic_train.agent.local_agent import torch_restarts_left
from elastic_train.agent.restart_budget import UNLIMITED, RestartBudget
from elastic_train.config import FailureConfig

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


@pytest.mark.parametrize("max_failures", [3, UNLIMITED])
def test_a_config_error_is_never_restarted_whatever_is_left_of_the_budget(max_failures):
    budget = RestartBudget(max_failures=max_failures)
    decision = budget.charge(FAILURE, config_error=True)
    assert not decision.restart and decision.config_error
    assert decision.restarts_left == (2 if max_failures == 3 else UNLIMITED)
    assert not budget.charge(FAILURE).config_error and budget.charge(PEER).restart


@pytest.mark.parametrize("max_failures", [0, 2, UNLIMITED])
def test_torchs_restart_counter_is_derived_from_the_budget(max_failures):
    """One restart counter: the budget decides, and torch's counter is derived from it
    (``local_agent.torch_restarts_left``). Under torch's own rule (restart while the
    counter is positive and take one off; the workers' TORCHELASTIC_RESTART_COUNT is
    ``max_restarts`` minus the counter) the group restarts exactly when the budget says,
    and the workers count the restarts charged to ``max_failures``, not the free ones."""
    max_restarts = FailureConfig(max_failures=max_failures).max_restarts
    budget = RestartBudget(max_failures=max_failures, max_preemptions=1)
    restarts, counts = [], []
    for kind in (PEER, FAILURE, PREEMPTION, PEER, FAILURE, FAILURE, PREEMPTION):
        decision = budget.charge(kind)
        counter = torch_restarts_left(max_restarts, budget, decision.restart)
        restarts.append(counter > 0)
        assert restarts[-1] == decision.restart
        if not decision.restart:
            break
        counts.append(max_restarts - (counter - 1))
    assert counts == {0: [0], 2: [0, 1, 1, 1, 2], UNLIMITED: [0, 1, 1, 1, 2, 3]}[max_failures]
    assert restarts[-1] is False
