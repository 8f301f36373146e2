"""``python -m bench --only NAME`` puts that figure's new section into BENCHMARKS.md in
place of its old one, keeps every other figure, and moves the old section to
docs/benchmarks-history.md (it used to rewrite BENCHMARKS.md with that figure alone)."""

from __future__ import annotations

import dataclasses
import datetime
import pathlib

import pytest

import bench.__main__ as bench_main
from bench.report import FigureRun, Table, document
from bench.splice import sections, splice

ROOT = pathlib.Path(__file__).resolve().parents[2]
STARTED = datetime.datetime(2026, 11, 29, 1, 0, tzinfo=datetime.timezone.utc)
HISTORY = "# History\n\n## Superseded sections\n\nNone yet: nothing was measured again.\n"


def _report(*runs: tuple[str, str, str]) -> str:
    """A report of figures ``(name, heading, the cell of their one table)``."""
    return document("python -m bench", "full", 1.0, [], [
        FigureRun(name, heading, "", STARTED, (1.0, 1.0), [Table(f"{heading} t", ["x"], [[cell]])])
        for name, heading, cell in runs])


def test_a_figure_measured_again_replaces_its_section_and_row_and_the_old_one_moves():
    report = _report(("steps", "Figure 2: steps", "old"), ("storage", "Figure 7: storage", "7"))
    measured = _report(("steps", "Figure 2: steps", "new")).replace("01:00", "02:00")

    spliced, history = splice(report, HISTORY, measured, "2026-11-29 02:00 UTC")

    new, old = sections(spliced), sections(report)
    assert spliced[slice(*new["storage"])] == report[slice(*old["storage"])]
    assert "| new |" in spliced[slice(*new["steps"])] and "| old |" not in spliced
    assert spliced.count("(`steps`) |") == 1 and "01:00 UTC, source" not in \
        spliced.split("## Machine")[0].split("(`steps`)")[1].split("\n")[0]
    assert "None yet" not in history
    moved = history.split("### `steps`, superseded 2026-11-29 02:00 UTC", 1)[1]
    assert "#### Figure 2: steps (`steps`)" in moved and "| old |" in moved

    again, history = splice(spliced, history, measured.replace("| new |", "| newer |"), "03:00")
    assert history.index("superseded 03:00") < history.index("superseded 2026-11-29 02:00")
    assert "| newer |" in again and "| new |" in history


def test_a_figure_the_report_lacks_is_added_with_its_status_row():
    report = _report(("steps", "Figure 2: steps", "2"))
    spliced, history = splice(report, HISTORY, _report(("soak", "Figure 14: soak", "14")), "t")
    status = spliced.split("## Where things stand")[1].split("\n## ")[0]
    assert "(`steps`)" in status and "(`soak`)" in status
    assert list(sections(spliced)) == ["steps", "soak"] and history == HISTORY


def test_a_report_without_a_status_table_is_not_guessed_at():
    with pytest.raises(ValueError, match="python -m bench`, or pass --output"):
        splice("# Benchmarks\n\n### Figure 2\n", HISTORY, _report(("steps", "F 2", "2")), "t")


def test_only_without_output_splices_the_repositorys_report(tmp_path, monkeypatch):
    report, history = tmp_path / "BENCHMARKS.md", tmp_path / "history.md"
    report.write_text((ROOT / "BENCHMARKS.md").read_text())
    history.write_text((ROOT / "docs" / "benchmarks-history.md").read_text())
    monkeypatch.setattr(bench_main, "DEFAULT_OUTPUT", report)
    monkeypatch.setattr(bench_main, "HISTORY", history)
    monkeypatch.setattr(bench_main, "FULL", dataclasses.replace(bench_main.FULL, digest_mib=1))
    monkeypatch.setattr("bench.suite.launch_help", lambda: None)

    assert bench_main.main(["--only", "digest_cost"]) == 0

    before, after = (ROOT / "BENCHMARKS.md").read_text(), report.read_text()
    old, new = sections(before), sections(after)
    assert list(new) == list(old)
    for name in old:
        if name != "digest_cost":
            assert after[slice(*new[name])] == before[slice(*old[name])], name
    assert "over 1 MiB" in after[slice(*new["digest_cost"])]
    assert "### `digest_cost`, superseded" in history.read_text()
    assert history.read_text().endswith((ROOT / "docs" / "benchmarks-history.md").read_text()
                                        .split("## Superseded sections", 1)[1]
                                        .split("\n\n", 2)[2])
