"""Puts figures measured alone into BENCHMARKS.md: ``python -m bench --only NAME``.

Each figure of the new report (what :func:`bench.report.document` wrote for the run)
replaces that figure's section and status row in BENCHMARKS.md; every other figure stays
as it was. The section it replaces moves to docs/benchmarks-history.md, under its
"Superseded sections" heading, newest first, so the history loses nothing.

Example::

    report, history = splice(report, history, document(...), "2026-11-29 01:04 UTC")
"""

from __future__ import annotations

import re

SECTION = re.compile(r"^## Figure .+ \(`(\w+)`\)$", re.MULTILINE)
STATUS = "## Where things stand"
SUPERSEDED = "## Superseded sections"
NONE_YET = "None yet"  # how the history's superseded part starts while it is empty


def sections(text: str) -> dict[str, tuple[int, int]]:
    """Where each figure's section of a report starts and ends, by the figure's name: from
    its heading to the next heading of its level, or the end."""
    heads = list(SECTION.finditer(text))
    spans = {}
    for head in heads:
        following = re.search(r"^## ", text[head.end():], re.MULTILINE)
        spans[head.group(1)] = (head.start(),
                                head.end() + following.start() if following else len(text))
    return spans


def _status_row(text: str, name: str) -> re.Match[str] | None:
    """The figure's row of the report's status table."""
    part = text.index(STATUS)
    return re.compile(rf"^\| [^\n]*\(`{name}`\) \|[^\n]*\n", re.MULTILINE).search(text, part)


def _demoted(section: str, levels: int) -> str:
    return re.sub(r"^(#+) ", lambda m: "#" * (len(m.group(1)) + levels) + " ", section,
                  flags=re.MULTILINE)


def splice(report: str, history: str, measured: str, when: str) -> tuple[str, str]:
    """``report`` with the figures of ``measured`` in place of their sections and status
    rows (a figure it lacks: appended), and ``history`` with the sections they replace
    added under its superseded part, each headed by the figure's name and ``when``."""
    if STATUS not in report:
        raise ValueError(f"BENCHMARKS.md has no '{STATUS}' table to update: write it whole "
                         "with `python -m bench`, or pass --output FILE")
    superseded = []
    new_spans = sections(measured)
    for name, (start, end) in new_spans.items():
        section = measured[start:end].rstrip("\n") + "\n\n"
        old = sections(report).get(name)
        if old is None:
            report = report.rstrip("\n") + "\n\n" + section
        else:
            superseded.append(f"### `{name}`, superseded {when}\n\n"
                              + _demoted(report[old[0]:old[1]], 2).rstrip("\n") + "\n")
            report = report[:old[0]] + section + report[old[1]:]
        new_row, old_row = _status_row(measured, name), _status_row(report, name)
        if old_row is not None:
            report = report[:old_row.start()] + new_row.group(0) + report[old_row.end():]
        else:
            table_end = report.index("\n\n", report.index("\n|", report.index(STATUS))) + 1
            report = report[:table_end] + new_row.group(0) + report[table_end:]
    return report.rstrip("\n") + "\n", _with_superseded(history, superseded)


def _with_superseded(history: str, superseded: list[str]) -> str:
    """``history`` with ``superseded`` first under its superseded part (created at the end
    when missing; its "None yet" line removed)."""
    if not superseded:
        return history
    if SUPERSEDED not in history:
        history = history.rstrip("\n") + f"\n\n{SUPERSEDED}\n\n"
    head, _, rest = history.partition(SUPERSEDED + "\n\n")
    if rest.startswith(NONE_YET):
        rest = rest.split("\n\n", 1)[1] if "\n\n" in rest else ""
    return head + SUPERSEDED + "\n\n" + "\n".join(superseded) + "\n" + rest
