"""Unit tests: Young/Daly's interval, should_checkpoint()'s rule (the same answer on
every rank), and show's advice."""

from __future__ import annotations

import math

import pytest

from elastic_train.goodput import interval as ci
from elastic_train.goodput.breakdown import Cause, Goodput
from elastic_train.worker.attempt_clock import AttemptClock, RunHistory


def test_the_optimum_is_sqrt_2_c_mtbf_and_wastes_the_least():
    assert ci.optimum(2.0, 3600.0) == pytest.approx(120.0)
    assert ci.optimum(0.0, 3600.0) == 0.0
    best = ci.waste(120.0, 2.0, 3600.0)
    assert best == pytest.approx(2.0 / 120.0 + 120.0 / 7200.0)
    assert all(ci.waste(t, 2.0, 3600.0) > best for t in (60.0, 119.0, 121.0, 240.0))
    assert ci.waste(0.0, 2.0, 3600.0) == math.inf


def test_the_mtbf_is_observed_once_a_failure_was_seen_else_the_prior():
    assert ci.mtbf(600.0, 3) == pytest.approx(200.0)
    assert ci.mtbf(600.0, 0) == ci.PRIOR_MTBF_S
    assert ci.mtbf(600.0, 0, prior_s=60.0) == 600.0  # a run that outlived its prior
    assert ci.mtbf(5000.0, 0) == 5000.0


def test_a_checkpoint_is_due_once_the_next_report_passes_the_optimum():
    # C = 2 s, MTBF = 100 s: every 20 s of training
    assert ci.is_due(15.0, 5.0, 2.0, 100.0) and not ci.is_due(14.0, 5.0, 2.0, 100.0)
    assert ci.is_due(0.0, None, None, 100.0)  # nothing measured yet: save, to measure it
    assert not ci.is_due(0.0, None, 2.0, 100.0)  # the attempt's first report: not yet


def test_the_advice_compares_the_interval_used_with_the_optimum():
    seconds = dict.fromkeys(Cause, 0.0)
    seconds.update({Cause.PRODUCTIVE: 90.0, Cause.RECOMPUTE: 10.0, Cause.CHECKPOINT: 20.0})
    goodput = Goodput(wall_s=200.0, seconds=seconds, failures=2, checkpoints=10)
    advice = ci.advise(goodput)
    # C = 2 s, MTBF = 100 s: optimum 20 s; the run saved every 10 s of training
    assert (advice.used_s, advice.save_cost_s, advice.mtbf_s) == (10.0, 2.0, 100.0)
    assert advice.optimum_s == pytest.approx(20.0)
    assert advice.extra_s == pytest.approx((0.2 + 0.05 - 0.1 - 0.1) * 90.0)  # per s of work
    assert "optimum sqrt(2*C*MTBF) = 20.00 s" in advice.describe()
    assert ci.advise(Goodput(wall_s=5.0, seconds=seconds)) is None  # no checkpoint yet


class Ticks:
    """One rank's monotonic clock, moved by the test."""

    def __init__(self, start: float):
        self.t = start

    def __call__(self) -> float:
        return self.t


def test_every_rank_answers_alike_whatever_its_own_clock_says():
    """Two ranks whose clocks differ (another origin, rank 1 slower to save) follow the
    reports' shared numbers to the same answers, at Young/Daly's interval: C is the slower
    rank's save, 1.4 s, the prior MTBF 50 s: sqrt(2*1.4*50) = 11.8 s, so every 6th report
    of 2 s of training. The first two reports save: the first measures C, which every
    rank learns in the report after it."""
    history = RunHistory()  # a fresh run: no save cost known yet
    clocks = [Ticks(0.0), Ticks(1000.0)]
    ranks = [AttemptClock(history, 0, monotonic=c) for c in clocks]
    answers = []
    for iteration in range(1, 21):
        said = [rank.should_checkpoint(prior_mtbf_s=50.0) for rank in ranks]
        answers.append(said[0])
        assert said[0] == said[1], iteration
        for clock, slow in zip(clocks, (0.0, 0.3), strict=True):
            clock.t += (1.0 if said[0] else 0.0) + slow  # the user's save, before report()
        numbers = [rank.shared_numbers() for rank in ranks]
        columns = [[n[i] for n in numbers] for i in range(3)]  # as the all_reduce gives them
        for clock, rank in zip(clocks, ranks, strict=True):
            rank.waited()
            clock.t += 0.1 if said[0] else 0.0  # the report's own wait on the save
            rank.report_ends(columns, any(said), iteration)
            clock.t += 2.0  # two seconds of training to the next report
    assert [i for i, a in enumerate(answers) if a] == [0, 1, 7, 13, 19]


def test_history_gives_a_new_attempt_its_save_cost_and_failures():
    seconds = dict.fromkeys(Cause, 0.0)
    seconds[Cause.CHECKPOINT] = 3.0
    history = RunHistory.of(Goodput(wall_s=30.0, seconds=seconds, failures=3, checkpoints=6))
    assert history == RunHistory(observed_s=30.0, failures=3, save_cost_s=0.5)
    clock = AttemptClock(history, 4, monotonic=Ticks(0.0))
    assert not clock.should_checkpoint(3600.0)  # C known: not before the attempt's first report
