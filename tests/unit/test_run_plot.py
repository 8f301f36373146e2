"""``show --plot``'s parts without a run: when each report was made, and the error that
names the extra when matplotlib is missing (the picture of a real faulted run:
tests/e2e/test_metrics_export.py)."""

from __future__ import annotations

import sys

import pytest

import elastic_train as et
from elastic_train.cli import run_plot


def test_report_times_are_exact_within_an_attempt_from_whole_second_stamps():
    start = 1000.3  # the attempt's session start; rows carry whole seconds
    rows = [{"timestamp": int(start + t), "time_since_restore": t,
             "iterations_since_restore": i + 1} for i, t in enumerate([0.5, 0.8, 1.75])]
    restart = 1010.6
    rows += [{"timestamp": int(restart + 0.2), "time_since_restore": 0.2,
              "iterations_since_restore": 1}, {"timestamp": 1012}]  # an old row's fields
    times = run_plot.report_times(rows)
    assert times[:3] == pytest.approx([1000.75, 1001.05, 1002.0])  # start bounded: 1000.25
    assert times[3] == pytest.approx(1010.0)  # one row: its second, at worst
    assert times[4] == 1012


def test_a_missing_matplotlib_is_named_with_its_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(et.ConfigError, match=r"elastic-train\[plot\]"):
        run_plot.plot("x.png", None, None, None)
