"""Run directories that whoever may write a storage path can craft, for ``ls`` and ``show``:
strings that hold terminal control sequences in every place the CLI prints from storage
(the directory's name, run.json's strings, a checkpoint's metric names and values), and
runs where a FIFO stands for one of its files (a read of it never ends)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import fsspec

from elastic_train.storage import CheckpointStore, CommitManifest

TITLE = "\x1b]0;owned\x07"  # sets the terminal window's title
CLIPBOARD = "\x1b]52;c;aGVsbG8=\x07"  # OSC 52: writes the clipboard
OVERWRITE = "\rstatus:   finished"  # back to the line's start: the real status overwritten
CLEAR = "\x1b[2J"  # CSI: clears the screen
C1_CSI = "\x9b31m"  # C1's one-byte CSI
DEL = "\x7f"
RAW = (TITLE, CLIPBOARD, OVERWRITE, CLEAR, C1_CSI, DEL, "\x1b", "\x07", "\x9b")


def crafted_run(root: Path) -> str:
    """A failed run under ``root`` whose every shown string holds control sequences; its
    directory's name."""
    name = f"crafted{TITLE}"
    run = root / name
    run.mkdir(parents=True)
    score = f"loss{CLEAR}"
    failure = {"time": 2.0, "workers": [{"rank": 1, "exitcode": 1,
                                         "message": f"RuntimeError: x{OVERWRITE}{CLIPBOARD}",
                                         "hostname": f"node{C1_CSI}"}],
               "restart": f"new processes{DEL}"}
    state = {"status": "failed", "format_version": 1, "created": 1.0, "name": name,
             "error": f"Training failed{OVERWRITE}{CLIPBOARD}\nsecond line{TITLE}",
             "spec": {"train_function": f"train:loop{CLEAR}",
                      "checkpoint_config": {"checkpoint_score_attribute": score},
                      "failure_config": {"max_failures": f"1{TITLE}"}},
             "launches": [{"started": 1.0, "host": f"host{C1_CSI}", "pid": 7,
                           "status": "failed"}],
             "failures": [failure]}
    (run / "run.json").write_text(json.dumps(state))
    store = CheckpointStore(fsspec.filesystem("file"), str(run))
    src = root.parent / f"{root.name}-checkpoint-src"
    src.mkdir()
    (src / "model.pt").write_bytes(b"weights")
    store.upload(0, str(src), ["model.pt"])
    store.commit(CommitManifest(0, 1, {score: f"0.5{CLIPBOARD}", f"acc{TITLE}": 1.0},
                                {}, world_size=1))
    return name


def fifo_run(root: Path, name: str, entry: str = "metrics.jsonl") -> str:
    """A run ``name`` under ``root`` whose ``entry`` (a path in its directory) is a FIFO no
    one writes; its name."""
    run = root / name
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"status": "finished", "format_version": 1,
                                              "created": 3.0}))
    (run / entry).parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(run / entry)
    return name
