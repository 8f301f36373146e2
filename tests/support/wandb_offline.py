"""Reads back what an offline W&B run wrote: its history rows, config and exit code.

An offline run is ``<WANDB_DIR>/wandb/offline-run-*-<id>/run-<id>.wandb``: a
7-byte header, then records in LevelDB's log format (32 KiB blocks; each
record a 7-byte header -- CRC, little-endian length, type -- and its bytes,
split into first/middle/last pieces across blocks), each a ``Record``
protobuf of wandb's.
"""

from __future__ import annotations

import glob
import json
import os
import struct
from dataclasses import dataclass, field
from typing import Any

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: str) -> list[Any]:
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    out, pending, offset = [], b"", HEADER
    while offset + HEADER <= len(data):
        room = BLOCK - offset % BLOCK
        if room < HEADER:  # the block's tail is padding
            offset += room
            continue
        length, kind = struct.unpack("<HB", data[offset + 4:offset + 7])
        piece = data[offset + HEADER:offset + HEADER + length]
        offset += HEADER + length
        if kind == 0 and length == 0:
            break
        pending = piece if kind in (FULL, FIRST) else pending + piece
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
    return out


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


@dataclass
class OfflineRun:
    directory: str
    history: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None
    artifacts: list[str] = field(default_factory=list)


def read_offline_runs(wandb_dir: str) -> dict[str, OfflineRun]:
    """Every offline run under ``wandb_dir``, by run id (a resumed id: merged, in order)."""
    runs: dict[str, OfflineRun] = {}
    for path in sorted(glob.glob(os.path.join(wandb_dir, "wandb", "offline-run-*", "*.wandb"))):
        run_id = os.path.basename(path)[len("run-"):-len(".wandb")]
        run = runs.setdefault(run_id, OfflineRun(os.path.dirname(path)))
        for record in records(path):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                run.history.append({_key(i): json.loads(i.value_json)
                                    for i in record.history.item})
            elif kind in ("run", "config"):
                items = record.run.config.update if kind == "run" else record.config.update
                run.config.update({_key(i): json.loads(i.value_json) for i in items})
            elif kind == "exit":
                run.exit_code = record.exit.exit_code
            elif kind == "artifact":
                run.artifacts.append(record.artifact.name)
    return runs
