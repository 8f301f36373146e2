"""BENCHMARKS.md is a report of where things stand (#39 item 8): a status table of every
figure's goal and verdict, then one section per figure saying how, where and when it was
measured above its tables; what `python -m bench` writes has that shape, and the file
in the repository keeps it, with a section for every figure of the registry."""

from __future__ import annotations

import dataclasses
import datetime
import pathlib
import re
import types

from bench.digest_cost import digest_cost
from bench.figures import FIGURES
from bench.profiles import PROFILES, SMOKE
from bench.report import FigureRun, Table, document, verdict

ROOT = pathlib.Path(__file__).resolve().parents[2]
_SECTION = re.compile(r"^## (Figure .+) \(`(\w+)`\)$", re.MULTILINE)
# The command, the date, the source commit (the machine and load follow).
_MEASURED = re.compile(r"^_(Measured: .*`[^`]+`.*, 20\d\d-\d\d-\d\d .*, source \w+.*"
                       r"|Not measured yet: .+)_$")


def _table(*verdicts: str, note: str = "") -> Table:
    table = Table("Figure X — t", ["variant", "ratio, target"],
                  [[f"v{i}", f"0.9 ≤ 1 {v}"] for i, v in enumerate(verdicts)])
    table.notes = [note] if note else []
    return table


def test_a_figures_verdict_counts_its_pass_and_miss_cells_and_notes():
    assert verdict([_table("PASS", "PASS")]) == "PASS"
    assert verdict([_table("PASS"), _table("MISS", "PASS")]) == "MISS (1 of 3)"
    assert verdict([_table(note="- Goal, ours at 1024 nodes: ≤ 10 s MISS")]) == "MISS (1 of 1)"
    assert verdict([Table("t", ["a"], [["PASSED"]])]) == "—"


def _sections(text: str) -> dict[str, str]:
    """Each figure's section of a report, by the figure's name."""
    heads = list(_SECTION.finditer(text))
    return {m.group(2): text[m.end():heads[i + 1].start() if i + 1 < len(heads) else None]
            for i, m in enumerate(heads)}


def test_the_written_report_has_a_status_row_and_a_measured_section_per_figure():
    started = datetime.datetime(2026, 11, 29, 1, 0, tzinfo=datetime.timezone.utc)
    runs = [FigureRun("steps", "Figure 2: steps", "≥ 0.99", started, (0.5, 1.25),
                      [_table("PASS", "MISS")]),
            FigureRun("storage", "Figure 7: storage", "", started, (1.0, 1.0), [_table()])]
    failed = Table("Failed runs (left out of the figures)", ["variant"], [["a"]])
    text = document("python -m bench --only steps --only storage", "full", 12.0,
                    ["a method line"], runs, failed)

    status = text.split("## Where things stand", 1)[1].split("\n## ", 1)[0]
    assert "| Figure 2: steps (`steps`) | ≥ 0.99 | MISS (1 of 2) | 2026-11-29 01:00 UTC" \
        in status
    assert "| Figure 7: storage (`storage`) | — (informs) | — |" in status
    sections = _sections(text)
    assert list(sections) == ["steps", "storage"]
    for body in sections.values():
        measured = body.strip().splitlines()[0]
        assert _MEASURED.match(measured), measured
        assert "`python -m bench --only steps --only storage`" in measured
    assert "load average 0.5 / 1.2 (start / end)" in sections["steps"]
    assert "Goal: ≥ 0.99." in sections["steps"] and "Goal:" not in sections["storage"]
    assert sections["storage"].rstrip().endswith("| a |"), "the failed runs come last"
    assert "docs/benchmarks-history.md" in text


def test_benchmarks_md_has_the_report_shape_with_a_section_for_every_figure():
    text = (ROOT / "BENCHMARKS.md").read_text()
    status = text.split("## Where things stand", 1)[1].split("\n## ", 1)[0]
    sections = _sections(text)
    assert sorted(sections) == sorted(FIGURES), "one section per figure of bench/figures.py"
    for name, body in sections.items():
        assert f"{FIGURES[name].heading} (`{name}`)" in status, f"{name}: no status row"
        measured = body.strip().splitlines()[0]
        assert _MEASURED.match(measured), f"{name}: its section starts with {measured!r}"
    history = ROOT / "docs" / "benchmarks-history.md"
    assert history.is_file() and "docs/benchmarks-history.md" in text


def test_every_profile_names_figures_of_the_registry():
    for profile in PROFILES.values():
        assert set(profile.figures or ()) <= set(FIGURES), profile.name
    headings = [figure.heading for figure in FIGURES.values()]
    assert len(set(headings)) == len(headings)


def test_the_digest_figure_measures_every_checksum_beside_crc32():
    suite = types.SimpleNamespace(profile=dataclasses.replace(SMOKE, digest_mib=2))
    [table] = digest_cost(suite)
    assert [row[0].split(" (")[0] for row in table.rows] == \
        ["CRC-32", "SHA-256", "BLAKE2b", "CRC-32 + SHA-256 in one pass"]
    speeds = [float(row[1]) for row in table.rows]
    assert all(s > 0 for s in speeds) and table.rows[0][2] == "1.00"
    assert "2 MiB" in table.title
