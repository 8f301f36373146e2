"""Markdown output: tables, the machine description, and BENCHMARKS.md itself.

BENCHMARKS.md is a report of where things stand: a table of every figure's goal and
verdict, then one section per figure that says how, where and when it was measured
(the exact command, the machine, the date, the source commit) above its tables. A
figure measured again replaces its section (:mod:`bench.splice`); the runs before it go
to docs/benchmarks-history.md.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import subprocess
from dataclasses import dataclass, field


@dataclass
class Table:
    """One markdown table with a heading and notes under it."""

    title: str
    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        self.rows.append([str(c) for c in cells])

    def markdown(self, level: int = 3) -> str:
        """The table under a heading of ``level`` (markdown's ``#`` count)."""
        lines = [f"{'#' * level} {self.title}", "", "| " + " | ".join(self.headers) + " |",
                 "|" + "|".join("---" for _ in self.headers) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        if self.notes:
            lines.append("")
            lines += [f"- {note}" for note in self.notes]
        return "\n".join(lines) + "\n"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def source_version() -> str:
    """``git`` commit of the checkout, and whether elastic_train/ has local changes."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, text=True,
                                capture_output=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "elastic_train"], cwd=repo,
                               text=True, capture_output=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if not commit:
        return "unknown"
    return commit + (" + uncommitted changes in elastic_train/" if dirty else "")


def machine_lines(gpu: bool = False) -> list[str]:
    """Machine and software versions, one markdown bullet each; ``gpu``: figure 15 is
    among the figures run (it names its card and torch version itself)."""
    import torch

    import elastic_train

    return [
        f"- CPU: {os.cpu_count()} × {cpu_model()} "
        f"({'GPU: figure 15 only, see there' if gpu else 'no GPU used'})",
        f"- OS: {platform.platform()}",
        f"- Python {platform.python_version()}, torch {torch.__version__}, "
        f"elastic-train {elastic_train.__version__} (source: {source_version()})",
    ]


@dataclass
class FigureRun:
    """One figure as measured: its name in ``bench.figures.FIGURES``, the heading and goal
    it has there, when it started, the load average at its start and end, its tables."""

    name: str
    heading: str
    goal: str
    started: datetime.datetime
    load: tuple[float, float]
    tables: list[Table]


INTRO = ("Written by `python -m bench` (bench/report.py), not by hand: a full run writes all "
         "of it; a figure measured alone (`python -m bench --only NAME`) replaces its section "
         "(bench/splice.py), and the section it replaces moves to "
         "[docs/benchmarks-history.md](docs/benchmarks-history.md), with everything older. "
         "Each section says how its figure was measured.")
_VERDICT = re.compile(r"\b(PASS|MISS)\b")


def verdict(tables: list[Table]) -> str:
    """What a figure's PASS/MISS cells and notes say together: ``PASS``, ``MISS (k of n)``,
    or ``—`` for a figure without any."""
    said = [m for t in tables for text in [*(c for row in t.rows for c in row), *t.notes]
            for m in _VERDICT.findall(text)]
    misses = said.count("MISS")
    if not said:
        return "—"
    return f"MISS ({misses} of {len(said)})" if misses else "PASS"


def status_table(runs: list[FigureRun], source: str) -> Table:
    """Where things stand: each figure's goal and verdict, and when it was measured."""
    table = Table("Where things stand", ["figure", "goal", "verdict", "measured"])
    for run in runs:
        table.add(f"{run.heading} (`{run.name}`)", run.goal or "— (informs)",
                  verdict(run.tables), f"{run.started:%Y-%m-%d %H:%M %Z}, source {source}")
    return table


def figure_section(run: FigureRun, command: str, source: str) -> str:
    """A figure's section: how it was measured, its goal, its tables."""
    lines = [f"## {run.heading} (`{run.name}`)", "",
             f"_Measured: `{command}`, {run.started:%Y-%m-%d %H:%M %Z}, source {source}, "
             f"{os.cpu_count()} × {cpu_model()}, load average {run.load[0]:.1f} / "
             f"{run.load[1]:.1f} (start / end)._", ""]
    if run.goal:
        lines += [f"Goal: {run.goal}.", ""]
    return "\n".join(lines) + "\n" + "\n".join(t.markdown() for t in run.tables)


def document(command: str, profile: str, runtime_s: float, method: list[str],
             runs: list[FigureRun], failed: Table | None = None, gpu: bool = False) -> str:
    """The whole BENCHMARKS.md: the status table, the machine and method, each figure's
    section, and the runs that failed (if any)."""
    source = source_version()
    parts = [
        "# Benchmarks: where elastic-train stands",
        "",
        INTRO,
        "",
        status_table(runs, source).markdown(level=2),
        "## Machine and method",
        "",
        *machine_lines(gpu),
        f"- Command: `{command}` (profile `{profile}`), {runtime_s:.0f} s in total",
        *[f"- {line}" for line in method],
        "",
        "",
    ]
    sections = [figure_section(run, command, source) for run in runs]
    if failed is not None:
        sections.append(failed.markdown())
    return "\n".join(parts) + "\n".join(sections)
