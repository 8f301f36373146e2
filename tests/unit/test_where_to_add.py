"""docs/ARCHITECTURE.md's "Where to add things" table lets a newcomer name the file for a
store, a rendezvous backend, a node policy, a chaos kind and a metric in one look (#39):
each of those has a row, every file the table names exists, and every name it gives
"in" or "of" a file (`STORES` in `.../stores/__init__.py`) is defined in that file."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
ESSENTIAL = ("a store", "a rendezvous backend", "a node policy", "a chaos kind", "a metric")
_PATH = re.compile(r"`((?:elastic_train|tests|bench|docs)/[\w./<>-]+|BENCHMARKS\.md)`")
_NAME_IN_FILE = re.compile(r"`([A-Za-z_]\w*)` (?:in|of) `([\w./-]+\.py)`")


def _rows() -> dict[str, str]:
    """The table's rows, by what they add ("a store (GCS, Azure, ...)" -> the row)."""
    part = ARCHITECTURE.read_text().split("## Where to add things", 1)[1].split("\n## ", 1)[0]
    return {line.split("|")[1].strip(): line for line in part.splitlines()
            if line.startswith("| a ")}


def _defines(path: pathlib.Path, name: str) -> bool:
    """Whether ``path`` defines ``name`` at its top level (a class, a function, a constant)."""
    return re.search(rf"^(?:class|def)\s+{name}\b|^{name}\s*(?::[^=\n]*)?=",
                     path.read_text(), re.MULTILINE) is not None


def test_the_table_has_a_row_for_each_thing_a_newcomer_adds_first():
    adds = list(_rows())
    for essential in ESSENTIAL:
        assert any(a.startswith(essential) for a in adds), f"no row for {essential!r}"


def test_every_file_the_table_names_exists():
    absent = []
    for add, row in _rows().items():
        cells = row.split("|")[2:4]
        assert all(_PATH.search(cell) for cell in cells if "nowhere" not in cell), \
            f"{add!r}: a cell names no file: {row}"
        for path in _PATH.findall(row):
            where = ROOT / path
            if not (where.parent.is_dir() if "<" in path else where.exists()):
                absent.append(path)
    assert not absent, f"docs/ARCHITECTURE.md's 'Where to add things' names {absent}"


def test_every_name_the_table_places_in_a_file_is_defined_there():
    wrong = [f"{name} in {path}" for row in _rows().values()
             for name, path in _NAME_IN_FILE.findall(row)
             if not (ROOT / path).is_file() or not _defines(ROOT / path, name)]
    assert not wrong, f"docs/ARCHITECTURE.md's 'Where to add things' places {wrong}"


def test_the_checks_see_a_name_that_is_not_there():
    faults = ROOT / "tests" / "chaos" / "faults.py"
    assert _defines(faults, "KINDS") and _defines(faults, "run_trial")
    assert not _defines(faults, "KIND") and not _defines(faults, "FIGURE_FUNCTIONS")
    assert _NAME_IN_FILE.findall("`FIGURES` of `bench/figures.py`; `X` in `a/b.py`") == \
        [("FIGURES", "bench/figures.py"), ("X", "a/b.py")]
