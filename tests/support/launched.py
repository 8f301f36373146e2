"""What the launch tests read back: the starts ``tests/e2e/scripts/launch_script.py`` recorded and a
run's stored state."""

from __future__ import annotations

import os
from typing import Any

from elastic_train.storage import RunStorage
from elastic_train.storage import filesystem as fsutil


def starts(out_dir) -> list[tuple[int, int]]:
    """(first epoch, world size) of each start of the script's rank 0."""
    path = out_dir / "starts"
    return [tuple(map(int, line.split())) for line in path.read_text().splitlines()] \
        if path.exists() else []


def latest_world(out_dir) -> int | None:
    """World size of the script's latest start (None before its first).

    A test of ``--nnodes 2:3`` that needs all three nodes waits for this to be 3, not for
    the first start to be: on a loaded machine the third agent may miss the first round's
    last call (2 s) and join the running job a moment later."""
    recorded = starts(out_dir)
    return recorded[-1][1] if recorded else None


def run_state(storage_path: str, name: str) -> dict[str, Any]:
    """The run's run.json, as stored."""
    fs, path = fsutil.resolve(os.path.join(storage_path, name))
    return RunStorage(fs, path).read_run_state().to_json()
