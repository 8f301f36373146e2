"""Users' mistakes in the train function, through ``fit()`` with real workers: each gets a
clear answer naming the rank and the fix (issue 42, its "Bad" list)."""

from __future__ import annotations

import logging
import math
import os

import pytest

import elastic_train as et
from elastic_train.torch import TorchTrainer
from tests.support import mistake_jobs

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120),
              pytest.mark.usefixtures("no_leaked_processes")]


def fit(fn, storage_path: str, name: str, workers: int = 2, **run_settings) -> et.Result:
    return TorchTrainer(fn, scaling_config=et.ScalingConfig(num_workers=workers),
                        run_config=et.RunConfig(storage_path=storage_path, name=name,
                                                **run_settings)).fit()


def test_nan_and_inf_metrics_stay_floats_and_a_nan_score_ranks_worst(storage_path):
    """A diverged loss is reported as NaN/±inf: the run goes on, the metrics are floats (as
    Ray's), and the checkpoint kept as the best is the one with a real number."""
    result = fit(mistake_jobs.report_nan_loss, storage_path, "nan", workers=1,
                 checkpoint_config=et.CheckpointConfig(
                     num_to_keep=2, checkpoint_score_attribute="loss",
                     checkpoint_score_order="min"))
    assert result.error is None
    assert result.metrics["loss"] == -math.inf
    losses = list(result.metrics_dataframe["loss"])
    assert losses[0] == 0.5 and math.isnan(losses[1]) and losses[2:] == [math.inf, -math.inf]
    assert result.metrics_dataframe["loss"].dtype == float
    kept = sorted(os.path.basename(c.path) for c, _ in result.best_checkpoints)
    assert kept == ["checkpoint_000000", "checkpoint_000003"]  # 0.5 and -inf; NaN went first
    assert result.get_best_checkpoint("loss", "max").path.endswith("checkpoint_000000")


def test_a_rank_that_returns_without_reporting_is_named(storage_path):
    """Rank 1 returns while rank 0 reports: both fail at once with the rule and the
    counts, not with gloo's "Connection closed by peer" after a wait."""
    with pytest.raises(et.TrainingFailedError) as info:
        fit(mistake_jobs.only_rank_0_reports, storage_path, "uneven")
    headline = str(info.value).splitlines()
    assert any("report() must be called by every rank the same number of times; rank 1 "
               "returned after 0 calls while rank 0 made call 1" in line for line in headline)
    assert "Connection closed" not in str(info.value)


def test_a_run_without_report_says_why_its_metrics_are_none(storage_path, caplog):
    """A train function that never calls report(): fit() succeeds, and says once that
    metrics and checkpoint are None for want of report()."""
    with caplog.at_level(logging.WARNING):
        result = fit(mistake_jobs.never_reports, storage_path, "silent", workers=1)
    assert result.return_value == 42 and result.metrics is None and result.checkpoint is None
    said = [r.getMessage() for r in caplog.records if "made no report()" in r.getMessage()]
    assert len(said) == 1 and "Result.metrics and Result.checkpoint are None" in said[0], said


def test_a_hang_names_the_rank_that_stopped_and_its_place(storage_path):
    """Rank 1 sleeps in the train function; rank 0 waits for it in report(). The root cause
    is rank 1, stuck in the user's frame (not the idle upload thread that faulthandler
    lists first); rank 0 is said to have waited for it."""
    with pytest.raises(et.TrainingFailedError) as info:
        fit(mistake_jobs.rank_1_sleeps, storage_path, "hang",
            failure_config=et.FailureConfig(hang_timeout_s=5))
    root, *others = info.value.failures
    assert root.rank == 1 and [o.rank for o in others] == [0]
    assert str(info.value).startswith("Training failed: rank 1 ")
    assert "HangError: rank 1 made no progress" in root.message
    assert "stuck at mistake_jobs.py:" in root.message and "rank_1_sleeps" in root.message
    assert "uploader.py" not in root.message and root.message in str(info.value)
    # Both are seen stale at once, as good as always (were rank 1 seen a moment before
    # rank 0, rank 0 would end with gloo's error instead: the waiter is then not named).
    if others[0].message.startswith("HangError"):
        assert "rank 0 waited for it in a collective" in root.message
        assert "it waited in a collective for rank 1" in others[0].message
        assert "called from mistake_jobs.py:" in others[0].message
