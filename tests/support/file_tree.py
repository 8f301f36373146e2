"""A directory's files as a value, to show that something left them untouched."""

from __future__ import annotations

import os


def snapshot(root) -> dict[str, bytes]:
    """Every file under ``root`` with its content."""
    files = {}
    for base, _, names in os.walk(root):
        for name in names:
            path = os.path.join(base, name)
            with open(path, "rb") as f:
                files[os.path.relpath(path, root)] = f.read()
    return files
