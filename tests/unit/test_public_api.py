"""The public API holds still (#39): every name ``elastic_train`` exports resolves, the
package's top level holds the public modules only, and every import the README and the
guides show works (imported, not run)."""

from __future__ import annotations

import ast
import importlib
import pathlib
import re

import pytest

import elastic_train
from tests.support.doc_blocks import doc_blocks

PACKAGE = pathlib.Path(elastic_train.__file__).parent
# The top level: the public API (Ray Train's names and their settings), no helpers; those
# live in the layer that uses them or in elastic_train/_internal/.
PUBLIC_MODULES = {"__init__", "callbacks", "checkpoint", "collective", "config", "context",
                  "errors", "rendezvous_config", "report_config", "result", "stragglers",
                  "validation_config"}
_IMPORT = re.compile(r"^\s*(?:from\s+elastic_train[\w.]*\s+import\b|import\s+elastic_train\b)")


@pytest.mark.parametrize("name", sorted(elastic_train._EXPORTS))
def test_each_export_imports_and_resolves(name):
    module = importlib.import_module(elastic_train._EXPORTS[name])
    assert getattr(elastic_train, name) is getattr(module, name)
    assert name in elastic_train.__all__ and name in dir(elastic_train)


def test_the_top_level_holds_the_public_modules_only():
    top = {path.stem for path in PACKAGE.glob("*.py")}
    assert top == PUBLIC_MODULES, (
        f"new at the top: {sorted(top - PUBLIC_MODULES)}, gone: {sorted(PUBLIC_MODULES - top)};"
        " an internal helper goes to the layer that uses it or to elastic_train/_internal/")
    assert len(top) <= 12


def import_statements(code: str) -> list[str]:
    """The ``import elastic_train...`` / ``from elastic_train... import ...`` statements of a
    code block, a parenthesised one with its continuation lines."""
    lines, found = code.splitlines(), []
    for number, line in enumerate(lines):
        if not _IMPORT.match(line):
            continue
        statement = line.strip()
        rest = iter(lines[number + 1:])
        while statement.count("(") > statement.count(")"):
            statement += " " + next(rest).strip()
        found.append(statement)
    return found


def test_import_statements_are_found_with_their_continuations():
    code = ("import os\nimport elastic_train\n  from elastic_train.torch import (\n"
            "      TorchTrainer,\n      prepare_model,\n  )\nx = 'from elastic_train import y'\n")
    assert import_statements(code) == [
        "import elastic_train", "from elastic_train.torch import ( TorchTrainer, prepare_model, )"]


def _doc_imports() -> list[tuple[str, str]]:
    return sorted({(str(block), statement) for block in doc_blocks()
                   if block.language == "python" for statement in import_statements(block.code)})


def _resolve(statement: str) -> None:
    node = ast.parse(statement).body[0]
    if isinstance(node, ast.Import):
        for alias in node.names:
            importlib.import_module(alias.name)
        return
    module = importlib.import_module(node.module)
    for alias in node.names:
        if not hasattr(module, alias.name):  # a submodule not imported by its package
            importlib.import_module(f"{node.module}.{alias.name}")


@pytest.mark.parametrize(("block", "statement"), _doc_imports())
def test_each_import_the_docs_show_resolves(block, statement):
    _resolve(statement)


def test_the_docs_show_imports():
    assert len(_doc_imports()) > 5  # the block parser still finds them
