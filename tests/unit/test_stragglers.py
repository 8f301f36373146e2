"""Straggler scores and naming: the pure rule, without processes."""

import random
import statistics
import time

import pytest

from elastic_train.errors import ConfigError
from elastic_train.stragglers import (
    Straggler,
    StragglerConfig,
    StragglerWatch,
    scores,
    step_fields,
)
from elastic_train.worker.control_group import ControlGroup
from elastic_train.worker.step_times import StepClock


def test_scores_are_relative_to_the_lower_median():
    assert scores([1.0, 1.0, 2.0]) == [1.0, 1.0, 2.0]
    assert scores([0.1, 0.3]) == pytest.approx([1.0, 3.0])  # two ranks: against the faster
    assert scores([0.0, 0.0]) == [1.0, 1.0]


def test_step_fields_name_the_slowest_rank_and_its_node():
    fields = step_fields([0.10, 0.11, 0.31, 0.10], nodes=[0, 0, 1, 1])
    assert fields == {"step_time_s": 0.10, "slowest_rank": 2,
                      "slowest_rank_score": 3.1, "slowest_node": 1}
    assert step_fields([0.2, 0.2], [0, 1])["slowest_rank"] == 0  # a tie: the lowest rank


def _rows(times_by_report, nodes):
    return [{**step_fields(times, nodes), "training_iteration": i + 1, "timestamp": 100 + i}
            for i, times in enumerate(times_by_report)]


def test_a_node_that_stays_slow_is_named_once():
    watch = StragglerWatch(StragglerConfig(window=3))
    named = [watch.observe(r) for r in _rows([[0.1, 0.4]] * 6, nodes=[0, 1])]
    assert named[:2] == [None, None] and named[3:] == [None] * 3
    assert named[2] == Straggler(node=1, rank=1, score=4.0, since_iteration=1, since=100.0)
    assert Straggler.from_json(named[2].to_json()) == named[2]


def test_noise_names_nobody():
    watch = StragglerWatch(StragglerConfig())
    # one slow report in every few, and millisecond steps twice as slow: no straggler
    spikes = [[0.1, 0.4] if i % 4 == 0 else [0.1, 0.1] for i in range(40)]
    tiny = [[0.001, 0.003]] * 40
    assert [watch.observe(r) for r in _rows(spikes + tiny, [0, 1])] == [None] * 80


def test_the_streak_starts_over_when_another_node_is_slowest():
    watch = StragglerWatch(StragglerConfig(window=2))
    rows = _rows([[0.4, 0.1], [0.1, 0.4], [0.1, 0.4]], nodes=[0, 1])
    named = [watch.observe(r) for r in rows]
    assert named[:2] == [None, None]
    assert (named[2].node, named[2].since_iteration) == (1, 2)


def test_the_named_straggler_stands_while_its_slow_reports_last():
    """``named``: what a node asks to know whether it is (still) the straggler."""
    watch = StragglerWatch(StragglerConfig(window=2))
    slow, steady = _rows([[0.1, 0.4]] * 3, nodes=[0, 1]), _rows([[0.1, 0.1]], nodes=[0, 1])
    watch.observe(slow[0])
    assert watch.named is None  # one slow report of two
    first = watch.observe(slow[1])
    assert first is not None and watch.named == first and first.node == 1
    assert watch.observe(slow[2]) is None and watch.named == first  # named once, stands
    watch.observe(steady[0])
    assert watch.named is None  # no longer slow: withdrawn


@pytest.mark.parametrize("kwargs", [{"score_threshold": 1.0}, {"window": 0},
                                    {"min_excess_s": -1}, {"window": True},
                                    {"replace": 1}, {"replace": "yes"}, {"cool_off_s": -1},
                                    {"cool_off_s": float("inf")}, {"cool_off_s": True}])
def test_config_errors_name_the_field(kwargs):
    with pytest.raises(ConfigError, match=f"StragglerConfig.{next(iter(kwargs))}"):
        StragglerConfig(**kwargs)


def test_replacement_is_off_by_default_and_cools_off_ten_minutes():
    assert (StragglerConfig().replace, StragglerConfig().cool_off_s) == (False, 600.0)
    assert StragglerConfig(replace=True, cool_off_s=0).cool_off_s == 0


def test_step_clock_counts_own_time_per_marker():
    clock = StepClock()
    time.sleep(0.02)
    assert clock.report_begins() >= 0.02  # no markers: the whole interval
    time.sleep(0.05)  # inside the report: not the rank's own time
    clock.report_ends()
    for _ in range(4):
        time.sleep(0.01)
        clock.step()
    assert 0.01 <= clock.report_begins() < 0.03


def test_one_worker_exchanges_without_a_collective():
    assert ControlGroup(1).any_rank_and_each((True, False), (0.5, 0)) == (
        (True, False), [[0.5], [0]])


def test_step_fields_score_only_the_slowest_as_scoring_every_rank_would():
    rng = random.Random(7)
    for _ in range(500):
        n = rng.randint(1, 40)
        times = [rng.choice([0.0, 0.1, 0.2, rng.random()]) for _ in range(n)]
        nodes = [r // 4 for r in range(n)]
        every = scores(times)
        slowest = max(range(n), key=lambda r: (every[r], -r))
        assert step_fields(times, nodes) == {
            "step_time_s": statistics.median_low(times), "slowest_rank": slowest,
            "slowest_rank_score": round(every[slowest], 3), "slowest_node": nodes[slowest]}
