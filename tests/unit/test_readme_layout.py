"""docs/ARCHITECTURE.md's module map names every module of the package by its exact file
name, in the part of the map for its folder, and names no file that does not exist (#25,
#39: a reader finds each file's job without opening it); the paths its other parts name
exist."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "elastic_train"
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
# Folders the map shows as a whole (one line), not file by file.
WHOLE = ("torch", "lightning", "huggingface", "integrations")
_FILE = re.compile(r"(?<![\w./-])([A-Za-z_][A-Za-z0-9_]*\.py)\b")
_FOLDER = re.compile(r"( *)([a-z_]+)/(?:\s|$)")


def _map_block() -> str:
    text = ARCHITECTURE.read_text()
    return text.split("## How it works", 1)[1].split("```", 2)[1]


def map_files(block: str) -> dict[str, set[str]]:
    """The file names the map names, by folder relative to the package ("" for its top),
    from the map's indentation: a line that starts with ``name/`` opens that folder, and
    every line indented deeper belongs to it."""
    named: dict[str, set[str]] = {}
    stack: list[tuple[int, str]] = []  # (indent, folder path)
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if header := _FOLDER.match(line):
            parent = stack[-1][1] if stack else None
            name = header.group(2)
            path = "" if parent is None else (f"{parent}/{name}" if parent else name)
            stack.append((indent, path))
            if path.split("/")[0] in WHOLE:
                continue
        folder = stack[-1][1] if stack else ""
        named.setdefault(folder, set()).update(_FILE.findall(line))
    return named


def test_the_map_reads_folders_from_indentation():
    block = ("elastic_train/\n  a.py b.py      the top\n  agent/    x\n    api.py  c.py\n"
             "    zygote/   fork.py\n              server.py\n    d.py\n  worker/ e.py\n")
    assert map_files(block) == {"": {"a.py", "b.py"}, "agent": {"api.py", "c.py", "d.py"},
                                "agent/zygote": {"fork.py", "server.py"}, "worker": {"e.py"}}


def test_every_module_is_named_by_its_file_name_in_its_folders_part_of_the_map():
    named = map_files(_map_block())
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        folder = "/".join(relative.parts[:-1])
        if relative.parts[0] in WHOLE or path.name in ("__init__.py", "__main__.py"):
            continue
        if path.name not in named.get(folder, set()):
            missing.append(str(relative))
    assert not missing, f"docs/ARCHITECTURE.md's map does not name {missing}"


def test_every_file_the_map_names_exists():
    absent = [f"{folder}/{name}" if folder else name
              for folder, names in map_files(_map_block()).items() for name in sorted(names)
              if not (PACKAGE / folder / name).is_file()]
    assert not absent, f"docs/ARCHITECTURE.md's map names files that do not exist: {absent}"


def test_every_path_the_architecture_doc_names_exists():
    """The "Where to add things" table and the prose name files by their path from the
    repository's root."""
    paths = set(re.findall(r"`((?:elastic_train|tests|bench|docs)/[\w./<>-]+?)`",
                           ARCHITECTURE.read_text()))
    absent = sorted(p for p in paths if "<" not in p and not (ROOT / p).exists())
    assert not absent, f"docs/ARCHITECTURE.md names paths that do not exist: {absent}"
