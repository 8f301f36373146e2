"""Unit tests: the no-progress guard stops a run whose restarts bring nothing, even with an
unlimited budget, and names the failure that repeats."""

from __future__ import annotations

import pytest

from elastic_train._internal.failure_kinds import FailureKind
from elastic_train.agent.no_progress_guard import NoProgressGuard, Progress, signature
from elastic_train.agent.restart_budget import UNLIMITED, RestartBudget
from elastic_train.errors import WorkerFailure

NAN = "rank 1: ValueError: loss is nan"


def test_stops_after_limit_restarts_without_progress():
    guard = NoProgressGuard(limit=3, start=Progress(0, -1))
    assert guard.check(Progress(5, 1), NAN) is None  # the first attempt got somewhere
    assert [guard.check(Progress(5, 1), NAN) for _ in range(2)] == [None, None]
    reason = guard.check(Progress(5, 1), NAN)
    assert reason == ("no progress in 3 consecutive restarts (no checkpoint after "
                      "checkpoint_000001, no report past iteration 5); each failed with " + NAN)


@pytest.mark.parametrize("better", [Progress(6, 1), Progress(5, 2)])
def test_a_new_report_or_checkpoint_resets_the_count(better):
    guard = NoProgressGuard(limit=2, start=Progress(5, 1))
    assert guard.check(Progress(5, 1), NAN) is None  # the first attempt is not a restart
    assert guard.check(Progress(5, 1), NAN) is None
    assert guard.check(better, NAN) is None
    assert guard.check(better, NAN) is None
    assert guard.check(better, NAN) is not None


def test_history_trimmed_on_resume_is_no_progress():
    """A resume drops rows past the checkpoint: reaching them again is not progress."""
    guard = NoProgressGuard(limit=1, start=Progress(8, 3))
    assert guard.check(Progress(8, 3), NAN) is None
    assert guard.check(Progress(6, 3), NAN) is not None


def test_unknown_progress_counts_as_neither():
    guard = NoProgressGuard(limit=1)
    assert guard.check(None, NAN) is None
    assert guard.check(None, NAN) is None


def test_different_failures_are_named_by_the_last():
    guard = NoProgressGuard(limit=2)
    guard.check(Progress(), "rank 0: killed by SIGKILL")
    guard.check(Progress(), "rank 0: killed by SIGKILL")
    assert guard.check(Progress(), NAN).endswith("the last failed with " + NAN)


def test_off():
    guard = NoProgressGuard(limit=-1)
    assert all(guard.check(Progress(), NAN) is None for _ in range(20))


def test_budget_stops_even_when_unlimited_but_not_for_preemptions():
    budget = RestartBudget(max_failures=UNLIMITED, guard=NoProgressGuard(limit=2))
    decisions = [budget.charge(FailureKind.FAILURE, Progress(), NAN) for _ in range(3)]
    assert [d.restart for d in decisions] == [True, True, False]
    assert decisions[-1].no_progress and not decisions[-1].preemption_budget_spent
    guarded = RestartBudget(max_failures=UNLIMITED, guard=NoProgressGuard(limit=1))
    assert all(guarded.charge(FailureKind.PREEMPTION, Progress(), NAN).restart
               for _ in range(5))


def test_peer_failures_count_too():
    budget = RestartBudget(max_failures=0, guard=NoProgressGuard(limit=1))
    assert budget.charge(FailureKind.PEER, Progress(), NAN).restart
    assert budget.charge(FailureKind.PEER, Progress(), NAN).no_progress is not None


def test_signature_uses_the_error_line_or_how_the_process_ended():
    raised = WorkerFailure(rank=1, local_rank=1, pid=9, exitcode=1,
                           message="ValueError: loss is nan\nmore", traceback="Traceback ...")
    killed = WorkerFailure(rank=0, local_rank=0, pid=8, exitcode=-9,
                           message="To enable traceback see: ...", traceback=None)
    assert signature(raised) == NAN
    assert signature(killed) == "rank 0: killed by SIGKILL"
