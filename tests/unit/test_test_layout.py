"""The tests' own layout: no test module imports another test module (what two share lives
under ``tests/support/``), and ``tests/e2e/`` holds only test modules, its programs the
tests start (drivers, ``launch`` scripts, workers) being under ``tests/e2e/scripts/``."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

from tests.support.paths import REPO

TESTS = Path(REPO) / "tests"
NOT_TESTS = {"__init__.py", "conftest.py"}  # the only modules e2e/ holds beside its tests
# Code a test hands to a process it starts, as a string (``python -c``), imports too.
IMPORT_IN_TEXT = re.compile(r"^\s*(?:from|import)\s+(tests(?:\.\w+)+)", re.MULTILINE)


def is_test_module(dotted: str, root: Path) -> bool:
    """Whether ``dotted`` names a test module under ``root`` (a ``test_*.py`` file)."""
    parts = dotted.split(".")
    return (parts[0] == root.name and parts[-1].startswith("test_")
            and root.parent.joinpath(*parts).with_suffix(".py").is_file())


def imported_modules(path: Path, root: Path) -> set[str]:
    """Every module ``path`` imports, by its dotted name: ``import m``, ``from m import n``
    (``m.n`` too: ``n`` may be a module), relative imports resolved against ``root``, and
    the import lines of the strings it holds."""
    package = path.relative_to(root.parent).with_suffix("").parts[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[:len(package) - node.level + 1], *base.split(".")])
            base = base.strip(".")
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.update(IMPORT_IN_TEXT.findall(node.value))
    return found


def imports_of_tests(root: Path) -> list[str]:
    """``<file> imports <test module>`` for each test module under ``root`` that imports
    a test module (itself included)."""
    return [f"{path.relative_to(root.parent)} imports {name}"
            for path in sorted(root.rglob("test_*.py"))
            for name in sorted(imported_modules(path, root)) if is_test_module(name, root)]


def loose_e2e_modules(root: Path) -> list[str]:
    """The modules directly in ``root/e2e`` that are neither tests nor package files."""
    return sorted(name for name in os.listdir(root / "e2e")
                  if name.endswith(".py") and not name.startswith("test_")
                  and name not in NOT_TESTS)


def test_no_test_module_imports_another():
    found = imports_of_tests(TESTS)
    assert not found, ("move what they share into a module under tests/support/ and import "
                       f"it from there: {found}")


def test_e2e_holds_only_test_modules():
    loose = loose_e2e_modules(TESTS)
    assert not loose, ("move these programs into tests/e2e/scripts/ and start them from "
                       f"there: {loose}")


def test_the_checks_find_every_kind_of_import_and_loose_module(tmp_path):
    """The checks above, on a tree with one of each mistake, find every one (and nothing in
    a helper module or a test that imports tests/support only)."""
    root = tmp_path / "tests"
    (root / "e2e" / "scripts").mkdir(parents=True)
    (root / "unit").mkdir()
    (root / "support").mkdir()
    files = {
        "unit/test_a.py": "from tests.unit.test_b import helper\n",
        "unit/test_b.py": "import tests.e2e.test_c\nfrom tests.support import shared\n",
        "unit/test_c.py": "from tests.unit import test_a as other\n",
        "unit/test_d.py": "from . import test_b\nfrom .test_a import x\n",
        "unit/test_e.py": 'SCRIPT = """\nfrom tests.unit.test_e import fn\n"""\n',
        "unit/test_ok.py": "from tests.support.shared import test_like\nimport os\n",
        "support/shared.py": "from tests.unit.test_a import helper\n",  # not a test module
        "e2e/test_c.py": "", "e2e/conftest.py": "", "e2e/__init__.py": "",
        "e2e/driver.py": "", "e2e/scripts/launch_script.py": "",
    }
    for rel, text in files.items():
        (root / rel).write_text(text)
    assert imports_of_tests(root) == [
        "tests/unit/test_a.py imports tests.unit.test_b",
        "tests/unit/test_b.py imports tests.e2e.test_c",
        "tests/unit/test_c.py imports tests.unit.test_a",
        "tests/unit/test_d.py imports tests.unit.test_a",
        "tests/unit/test_d.py imports tests.unit.test_b",
        "tests/unit/test_e.py imports tests.unit.test_e",
    ]
    assert loose_e2e_modules(root) == ["driver.py"]
