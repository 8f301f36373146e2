"""Metric rows: the fields the project adds, counted across restarts; what readers show."""

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from elastic_train._internal.metric_rows import (
    AUTO_FIELDS,
    ReportRows,
    clean_metrics,
    jsonable,
    plotted,
    user_metrics,
)
from elastic_train.errors import ConfigError
from elastic_train.stragglers import STEP_FIELDS
from tests.support.paths import REPO


def test_rows_carry_every_auto_field_and_count_on_from_a_restore():
    rows = ReportRows(iteration=4, time_before_restore_s=100.0, start=1000.0)
    first = rows.next({"loss": 0.5}, now=1002.0)
    second = rows.next({"loss": 0.25}, now=1005.0)
    # the step-time fields are the session's, from every rank's step time
    assert set(first) == {"loss"} | (set(AUTO_FIELDS) - {"checkpoint_dir_name"} - set(STEP_FIELDS))
    assert (first["training_iteration"], second["training_iteration"]) == (5, 6)
    assert (first["iterations_since_restore"], second["iterations_since_restore"]) == (1, 2)
    assert (first["time_this_iter_s"], second["time_this_iter_s"]) == (2.0, 3.0)
    assert (first["time_since_restore"], second["time_since_restore"]) == (2.0, 5.0)
    assert (first["time_total_s"], second["time_total_s"]) == (102.0, 105.0)
    assert second["timestamp"] == 1005 and rows.iteration == 6


def test_readers_tell_the_users_metrics_from_the_added_fields():
    row = {**ReportRows(start=0.0).next({"loss": 0.5, "ok": True, "tag": "a"}, now=1.0),
           "checkpoint_dir_name": "checkpoint_000000"}
    assert user_metrics(row) == {"loss": 0.5, "ok": True, "tag": "a"}
    assert set(plotted(row)) == {"loss", "time_this_iter_s", "time_total_s",
                                 "time_since_restore", "iterations_since_restore"}


def test_single_numbers_become_json_numbers_and_the_rest_is_named():
    metrics = {"t": torch.tensor([2.5]), "n": np.float32(1.5), "a": np.array([3]),
               "inf": math.inf, "nested": {"x": (1, torch.tensor(2))}}
    assert clean_metrics(metrics) == {"t": 2.5, "n": 1.5, "a": 3, "inf": math.inf,
                                      "nested": {"x": [1, 2]}}
    with pytest.raises(ConfigError, match="'m'.*ndarray"):
        jsonable(np.zeros(2), "m")
    with pytest.raises(ConfigError, match="must be a dict"):
        clean_metrics([("loss", 1.0)])


def test_the_row_format_imports_no_torch():
    """``elastic-train ls``/``show`` read rows; they must not pay for ``import torch``."""
    code = "import sys, elastic_train._internal.metric_rows; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "False"
