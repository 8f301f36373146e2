"""``show --plot``'s parts without a run: when each report was made, the error that
names the extra when matplotlib is missing, the output path's errors and formats on a
run directory of one record (the picture of a real faulted run:
tests/e2e/test_metrics_export.py)."""

from __future__ import annotations

import json
import sys

import pytest

import elastic_train as et
from elastic_train.cli import run_plot
from elastic_train.cli.main import main


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
        run_plot.check_output("x.png")


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "results" / "run1"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"status": "finished", "format_version": 1,
                                              "created": 1.0}))
    return run


@pytest.mark.parametrize("given, words", [
    ("plots/run.png", ["'plots/run.png' cannot be written", "plots does not exist",
                       "create it"]),
    ("{run}", ["cannot be written: it is a directory", "run1/run.png"]),
], ids=["no-folder", "a-directory"])
def test_an_output_path_that_cannot_be_written_is_named_not_the_run(
        run_dir, tmp_path, monkeypatch, capsys, given, words):
    monkeypatch.chdir(tmp_path)
    assert main(["show", str(run_dir), "--plot", given.format(run=run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "show --plot" in err, err
    for word in words:
        assert word in err, err
    assert "does not exist; check the path" not in err and "cannot read" not in err, err


@pytest.mark.parametrize("suffix, magic", [("svg", b"<?xml"), ("pdf", b"%PDF"),
                                           ("png", b"\x89PNG")])
def test_the_suffix_names_the_format_written(run_dir, tmp_path, suffix, magic):
    pytest.importorskip("matplotlib")
    out = tmp_path / f"run.{suffix}"
    assert main(["show", str(run_dir), "--plot", str(out)]) == 0
    assert out.read_bytes().startswith(magic)


def test_an_unknown_suffix_is_refused_naming_the_formats(run_dir, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "run.graph"
    assert main(["show", str(run_dir), "--plot", str(out)]) == 2
    err = capsys.readouterr().err
    assert "run.graph' cannot be written" in err and ".png, " in err and ".svg" in err, err
    assert not out.exists()
