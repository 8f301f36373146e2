"""Top-k checkpoint retention as a pure decision."""

import math

import pytest

from elastic_train import CheckpointConfig, ConfigError
from elastic_train.storage.retention import CheckpointRecord, ranked, score_of, to_delete

LOSSES = [0.5, 0.1, 0.9, 0.3, 0.7]  # index 0..4; the latest (4) is neither best nor worst


def records(values, attr="loss"):
    return [CheckpointRecord(i, {attr: v}) for i, v in enumerate(values)]


def config(**kwargs):
    return CheckpointConfig(**kwargs)


def test_keeps_top_k_by_max_plus_latest():
    cfg = config(num_to_keep=2, checkpoint_score_attribute="loss")
    assert to_delete(records(LOSSES), cfg) == [0, 1, 3]  # keeps 2 (0.9), 4 (0.7)
    cfg = config(num_to_keep=1, checkpoint_score_attribute="loss")
    assert to_delete(records(LOSSES), cfg) == [0, 1, 3]  # keeps best 2 and latest 4


def test_keeps_top_k_by_min_plus_latest():
    cfg = config(num_to_keep=2, checkpoint_score_attribute="loss",
                 checkpoint_score_order="min")
    assert to_delete(records(LOSSES), cfg) == [0, 2]  # keeps 1, 3 and latest 4


def test_ranked_order_and_ties_by_recency():
    cfg = config(checkpoint_score_attribute="loss", checkpoint_score_order="min")
    assert [r.index for r in ranked(records(LOSSES), cfg)] == [1, 3, 0, 4, 2]
    cfg = config(checkpoint_score_attribute="loss")
    assert [r.index for r in ranked(records([1, 2, 2, 1]), cfg)] == [2, 1, 3, 0]


def test_without_attribute_keeps_most_recent():
    assert to_delete(records(LOSSES), config(num_to_keep=2)) == [0, 1, 2]
    assert [r.index for r in ranked(records(LOSSES), config())] == [4, 3, 2, 1, 0]


def test_num_to_keep_none_keeps_all():
    assert to_delete(records(LOSSES), config()) == []
    assert to_delete(records(LOSSES), config(checkpoint_score_attribute="loss")) == []
    assert to_delete([], config(num_to_keep=1)) == []


def test_missing_attribute_raises_naming_it():
    cfg = config(num_to_keep=2, checkpoint_score_attribute="loss")
    with pytest.raises(ConfigError, match="'loss'"):
        score_of(CheckpointRecord(5, {"acc": 1.0}), cfg)


@pytest.mark.parametrize("value", ["0.3", None, True])
def test_non_numeric_score_raises_naming_it(value):
    cfg = config(num_to_keep=2, checkpoint_score_attribute="loss")
    with pytest.raises(ConfigError, match="'loss'") as info:
        score_of(CheckpointRecord(5, {"loss": value}), cfg)
    assert repr(value) in str(info.value)


@pytest.mark.parametrize("order", ["min", "max"])
def test_a_nan_score_ranks_below_every_number_and_above_none(order):
    """A diverged loss does not stop the run: NaN is a score, the worst there is."""
    recs = [CheckpointRecord(0, {"loss": math.nan}), CheckpointRecord(1, {"loss": 0.5}),
            CheckpointRecord(2, {"acc": 1.0}), CheckpointRecord(3, {"loss": -math.inf})]
    cfg = config(num_to_keep=2, checkpoint_score_attribute="loss", checkpoint_score_order=order)
    assert math.isnan(score_of(recs[0], cfg))
    best = [1, 3] if order == "max" else [3, 1]
    assert [r.index for r in ranked(recs, cfg)] == [*best, 0, 2]
    assert to_delete(recs, cfg) == [0, 2]


@pytest.mark.parametrize("value", ["0.3", None, True, "missing"])
def test_checkpoints_without_a_score_rank_last_and_go_first(value):
    """Committed before a resume changed the score attribute: ranked, never raising."""
    unscored = [CheckpointRecord(i, {} if value == "missing" else {"loss": value})
                for i in (0, 1)]
    recs = unscored + [CheckpointRecord(i + 2, {"loss": x}) for i, x in enumerate((0.5, 0.7))]
    cfg = config(num_to_keep=2, checkpoint_score_attribute="loss", checkpoint_score_order="min")
    assert [r.index for r in ranked(recs, cfg)] == [2, 3, 1, 0]
    assert to_delete(recs, cfg) == [0, 1]
    assert to_delete(unscored, cfg) == []  # two to keep, and the latest always
