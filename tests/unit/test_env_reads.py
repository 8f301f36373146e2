"""One route per fact: no module reads an ``ELASTIC_TRAIN_*`` variable but the two that
own them -- :mod:`elastic_train._internal.env_vars` (the agent's facts, the user's switches) and
the worker plan's loader (the plan's path, the storage as given)."""

from __future__ import annotations

import ast
import pathlib
import re

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "elastic_train"
READERS = {PACKAGE / "_internal" / "env_vars.py", PACKAGE / "worker" / "worker_plan.py",
           # The zygote's stand-in imports only the standard library: it spells out
           # WORKER_PIDS_DIR itself (see elastic_train._internal.env_vars).
           PACKAGE / "agent" / "zygote" / "client.py"}
NAME = re.compile(r"ELASTIC_TRAIN_[A-Z_]+")


def _names_a_variable(node: ast.AST) -> bool:
    """``env_vars.SOMETHING``, or the string ``"ELASTIC_TRAIN_SOMETHING"``."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return node.value.id == "env_vars" and node.attr.isupper()
    return (isinstance(node, ast.Constant) and isinstance(node.value, str)
            and NAME.fullmatch(node.value) is not None)


def _sets_it(node: ast.AST, parent: ast.AST) -> bool:
    """A key of a dict literal (an environment being built), or ``environ[NAME] = ...``."""
    if isinstance(parent, ast.Dict):
        return node in parent.keys
    return (isinstance(parent, ast.Subscript) and parent.slice is node
            and isinstance(parent.ctx, ast.Store))


def _read_lines(source: str) -> list[int]:
    """The lines of ``source`` that read an ``ELASTIC_TRAIN_*`` variable."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    return sorted(node.lineno for node in ast.walk(tree)
                  if _names_a_variable(node) and not _sets_it(node, parents[node]))


def test_only_the_plan_loader_and_env_vars_read_elastic_train_variables():
    """A new setting for the workers goes into the worker plan
    (elastic_train/worker/worker_plan.py), or, if the agent sets it per worker or the
    user sets it, into env_vars.AgentFacts or env_vars.Switches."""
    found = [f"{path.relative_to(PACKAGE)}:{line}" for path in sorted(PACKAGE.rglob("*.py"))
             if path not in READERS for line in _read_lines(path.read_text())]
    assert found == []


def test_the_scan_sees_the_shapes_a_read_takes():
    source = ('import os\nfrom elastic_train._internal import env_vars\n'
              'a = os.environ.get(env_vars.ZYGOTE)\nb = os.environ["ELASTIC_TRAIN_X"]\n'
              'c = env_vars.LAUNCH in os.environ\nos.environ[env_vars.ATTEMPT] = "1"\n'
              'd = {env_vars.PLAN: "p", "ELASTIC_TRAIN_Y": "q"}\n')
    assert _read_lines(source) == [3, 4, 5]
