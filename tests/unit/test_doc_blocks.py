"""Every code block of the README and of the guides under docs/ is checked, so the docs
cannot rot (#39): each python block compiles; those that run on their own run (in a
process of their own, HOME a temporary directory; those that call ``fit()``: in
tests/e2e/test_doc_blocks.py); each ``elastic-train ...`` command of a bash block is
parsed by the real command-line parser (``launch``: its ``--dry-run``); a block that
cannot run here is listed in tests/support/doc_blocks.py's NOT_RUN with the reason."""

from __future__ import annotations

import ast
import json
import re

import pytest

from elastic_train.cli.launch_command import main_launch
from elastic_train.cli.main import build_parser
from tests.support.doc_blocks import (
    LAUNCH_SCRIPTS,
    NOT_RUN,
    PRELUDES,
    ROOT,
    doc_blocks,
    doc_files,
    run_python_block,
    runnable,
    shell_commands,
)

COMMANDS = [(str(block), command) for block in runnable("bash")
            for command in shell_commands(block.code)]


def test_the_lists_name_blocks_that_exist_by_their_first_line():
    """An entry whose block moved or changed fails here, rather than skip another block."""
    blocks = {block.key: block for block in doc_blocks()}
    for listing in (NOT_RUN, PRELUDES, LAUNCH_SCRIPTS):
        for key, (first_line, _) in listing.items():
            assert key in blocks, f"{key} names no block"
            assert blocks[key].first_line == first_line, \
                f"{key} is now {blocks[key].first_line!r}: update the entry"


def test_the_docs_have_blocks_and_every_listed_block_has_a_reason():
    assert len(doc_blocks()) >= 20
    assert all(reason.strip() for _, reason in NOT_RUN.values())


@pytest.mark.parametrize("block", [b for b in doc_blocks() if b.language == "python"], ids=str)
def test_every_python_block_compiles(block):
    ast.parse(block.code, filename=str(block))


@pytest.mark.parametrize("block", runnable("bash"), ids=str)
def test_a_run_bash_block_holds_only_elastic_train_commands(block):
    """Anything else in a bash block (a venv, pytest, srun) is listed in NOT_RUN."""
    commands = shell_commands(block.code)
    assert commands and all(command[0] == "elastic-train" for command in commands), \
        f"{block}: list it in NOT_RUN with a reason, or show only elastic-train commands"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("block", runnable("python", with_fit=False), ids=str)
def test_python_block_runs(block, tmp_path):
    run_python_block(block, tmp_path, timeout_s=100)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where,command", COMMANDS, ids=[f"{w}: {' '.join(c[:2])}"
                                                          for w, c in COMMANDS])
def test_elastic_train_command_parses(where, command, tmp_path, monkeypatch, capsys):
    """``launch``'s with ``--dry-run`` (which checks the script exists: an empty one is
    made), in an environment without ``PET_*``/``SLURM_*``; the others' with the
    command's parser, without running them."""
    arguments = command[1:]
    if arguments[0] == "launch":
        monkeypatch.chdir(tmp_path)
        for argument in arguments:
            if argument.endswith(".py"):
                (tmp_path / argument).touch()
        assert main_launch(["--dry-run", *arguments[1:]], env={}) == 0, \
            f"{where}: {capsys.readouterr().err}"
        settings = json.loads(capsys.readouterr().out)
        script = next(i for i, a in enumerate(arguments) if a.endswith(".py"))
        flags = {a for a in arguments[1:script] if a.startswith("--")}
        sources = {v["source"] for v in settings.values() if isinstance(v, dict)}
        assert flags <= sources, f"{where}: the dry run did not take {flags - sources}"
        assert settings["program"]["value"] == arguments[script:]
    else:
        parsed = build_parser().parse_args(arguments)
        assert parsed.command == arguments[0] and callable(parsed.func)


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_of_the_docs_leads_somewhere():
    """The README's sections moved into guides: each link between them names a file that
    exists and, with ``#anchor``, one of its headings."""
    broken = []
    for doc in doc_files():
        path = ROOT / doc
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)", path.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            linked = (path.parent / target).resolve() if target else path
            if not linked.exists():
                broken.append(f"{doc}: {target}")
            elif anchor and anchor not in {_anchor(h) for h in re.findall(
                    r"^#+ (.*)$", linked.read_text(), re.M)}:
                broken.append(f"{doc}: {target}#{anchor}")
    assert not broken, broken
