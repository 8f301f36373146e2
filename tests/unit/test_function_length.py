"""No function over ``MAX_LINES`` lines in the package or the benchmarks (issue #39, item 6).

A function is counted from its ``def`` line to its last line, docstring and comments
included (decorators not): one that grows past the bound is split along its steps into
functions whose names say what each does, or its long prose moves to the module's
docstring or to ``docs/``. Parsed, not imported, so the check needs no optional package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.paths import REPO

MAX_LINES = 60
CHECKED = ("elastic_train", "bench")  # the folders whose every module is checked


def long_functions(source: str, path: str) -> list[str]:
    """``path:function:lines`` for each function of ``source`` (methods and nested
    functions too) longer than ``MAX_LINES`` lines."""
    return [f"{path}:{node.name}:{node.end_lineno - node.lineno + 1}"
            for node in ast.walk(ast.parse(source, path))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_LINES]


def _function_of(lines: int, decorators: int = 0) -> str:
    """The source of a function ``lines`` long from its ``def``, under ``decorators``
    decorator lines, nested in a class."""
    body = "\n".join("        x = 1" for _ in range(lines - 2))
    return ("class C:\n" + "    @staticmethod\n" * decorators
            + f'    def f():\n        """Doc."""\n{body}\n')


@pytest.mark.parametrize("folder", CHECKED)
def test_no_function_is_longer_than_the_bound(folder):
    root = Path(REPO)
    modules = sorted((root / folder).rglob("*.py"))
    assert modules, f"no module under {root / folder}"
    found = [hit for path in modules
             for hit in long_functions(path.read_text(), str(path.relative_to(root)))]
    assert not found, (f"functions over {MAX_LINES} lines (file:function:lines): "
                       f"{', '.join(found)}; split each along its steps into named functions")


def test_the_bound_counts_from_the_def_line_to_the_last():
    assert long_functions(_function_of(MAX_LINES), "m.py") == []
    assert long_functions(_function_of(MAX_LINES + 1), "m.py") == [f"m.py:f:{MAX_LINES + 1}"]
    assert long_functions(_function_of(MAX_LINES, decorators=2), "m.py") == []
