"""Train functions that make a user's mistake, for tests/e2e/test_user_mistakes.py."""

from __future__ import annotations

import math
import os
import tempfile
import time

import elastic_train as et


def report_nan_loss(config: dict) -> None:
    """Reports a diverged loss (NaN, then ±inf) with a checkpoint each time."""
    for loss in (0.5, math.nan, math.inf, -math.inf):
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "state.txt"), "w") as f:
                f.write(str(loss))
            et.report({"loss": loss}, checkpoint=et.Checkpoint.from_directory(tmp))


def never_reports(config: dict) -> int:
    """Trains without a report(): returns its value only."""
    return 42


def only_rank_0_reports(config: dict) -> None:
    """Rank 1 returns at once; rank 0 reports."""
    if et.get_context().get_world_rank() == 1:
        return
    for step in range(3):
        et.report({"step": step})


def rank_1_sleeps(config: dict) -> None:
    """Rank 1 stops reporting (stuck in time.sleep); rank 0 waits for it in report()."""
    for step in range(3):
        if step == 1 and et.get_context().get_world_rank() == 1:
            time.sleep(600)
        et.report({"step": step})
