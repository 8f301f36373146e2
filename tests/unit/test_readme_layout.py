"""README's "How it works" shows the package's layout: every module of the folders it
shows is named there (#25: a reader finds each file's job without opening it)."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "elastic_train"
# Folders the layout shows as a whole (one line each), not file by file.
WHOLE = ("torch", "lightning", "huggingface", "integrations")


def _sections() -> dict[str, set[str]]:
    """The words of the layout's part for each top folder ("" for the package's own
    modules), from README's "How it works" block."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## How it works", 1)[1].split("```", 2)[1]
    sections: dict[str, set[str]] = {"": set()}
    current = ""
    for line in block.splitlines():
        header = re.match(r"  ([a-z_]+)/ ", line)
        if header and not line.startswith("   "):
            current = header.group(1)
        sections.setdefault(current, set()).update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", line))
    return sections


def test_every_module_is_named_in_its_folders_part_of_the_layout():
    sections = _sections()
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        folder = relative.parts[0] if len(relative.parts) > 1 else ""
        if folder in WHOLE or path.stem in ("__init__", "__main__"):
            continue
        if path.stem not in sections.get(folder, set()):
            missing.append(str(relative))
    assert not missing, f"README's layout does not name {missing}"
