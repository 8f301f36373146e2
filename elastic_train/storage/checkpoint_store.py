"""Checkpoints in the run directory, committed atomically.

A checkpoint is the directory ``checkpoint_NNNNNN/`` holding the files of
every rank that reported one, plus the commit marker ``.commit.json``
(:class:`CommitManifest`: index, metrics, file list with sizes and CRC-32s,
per-rank resume state) written last. A directory without the marker does not
exist for readers and is removed at the next start; deletion removes the
marker first, so a reader never sees half a checkpoint.

The protocol is the same on every fsspec store: files are written into their
final place (no directory rename, which object stores cannot do atomically)
and the marker is one small atomic write.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import fsspec

from elastic_train.storage import filesystem as fsutil

logger = logging.getLogger(__name__)

MARKER = ".commit.json"
_DIR_RE = re.compile(r"^checkpoint_(\d{6,})$")


def dir_name(index: int) -> str:
    return f"checkpoint_{index:06d}"


@dataclass
class CommitManifest:
    """The marker of a committed checkpoint."""

    index: int
    training_iteration: int
    metrics: dict[str, Any]
    files: dict[str, dict[str, Any]]
    world_size: int
    worker_states: dict[str, Any] = field(default_factory=dict)
    created: float = field(default_factory=time.time)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CommitManifest:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def scan_directory(local_dir: str) -> dict[str, dict[str, Any]]:
    """``{relative path: {"size", "crc32"}}`` of every file below ``local_dir``."""
    files = {}
    for root, _, names in os.walk(local_dir):
        for name in names:
            full = os.path.join(root, name)
            rel = os.path.relpath(full, local_dir).replace(os.sep, "/")
            if rel == MARKER:
                continue
            files[rel] = {"size": os.path.getsize(full), "crc32": fsutil.file_crc32(full)}
    return files


class CheckpointStore:
    """Reads, writes, commits and deletes the checkpoints of one run."""

    def __init__(self, fs: fsspec.AbstractFileSystem, run_path: str):
        self.fs = fs
        self.run_path = run_path

    def path(self, index: int) -> str:
        return fsutil.join(self.run_path, dir_name(index))

    def _checkpoint_dirs(self) -> dict[int, str]:
        self.fs.invalidate_cache(self.run_path)
        try:
            entries = self.fs.ls(self.run_path, detail=False)
        except FileNotFoundError:
            return {}
        dirs = {}
        for entry in entries:
            match = _DIR_RE.match(entry.rstrip("/").rsplit("/", 1)[-1])
            if match:
                dirs[int(match.group(1))] = entry.rstrip("/")
        return dirs

    def committed(self) -> list[CommitManifest]:
        """Every committed checkpoint, oldest first."""
        manifests = []
        for _, path in sorted(self._checkpoint_dirs().items()):
            marker = fsutil.join(path, MARKER)
            try:
                manifests.append(CommitManifest.from_json(fsutil.read_json(self.fs, marker)))
            except FileNotFoundError:
                continue
        return manifests

    def remove_uncommitted(self) -> list[int]:
        """Deletes leftovers of interrupted uploads; returns their indices."""
        removed = []
        for index, path in sorted(self._checkpoint_dirs().items()):
            if not self.fs.exists(fsutil.join(path, MARKER)):
                logger.info("Removing uncommitted checkpoint directory %s", path)
                self.fs.rm(path, recursive=True)
                removed.append(index)
        return removed

    def upload(self, index: int, local_dir: str, relpaths: Iterable[str]) -> None:
        """Copies the named files of ``local_dir`` into checkpoint ``index``."""
        target = self.path(index)
        for rel in relpaths:
            remote = fsutil.join(target, rel)
            self.fs.makedirs(remote.rsplit("/", 1)[0], exist_ok=True)
            self.fs.put_file(os.path.join(local_dir, rel), remote)

    def commit(self, manifest: CommitManifest) -> None:
        """Makes checkpoint ``manifest.index`` visible: the marker is written last."""
        fsutil.write_json_atomic(
            self.fs, fsutil.join(self.path(manifest.index), MARKER), asdict(manifest)
        )

    def delete(self, index: int) -> None:
        """Removes a whole checkpoint, marker first so it vanishes for readers at once."""
        path = self.path(index)
        self.fs.rm(fsutil.join(path, MARKER))
        self.fs.rm(path, recursive=True)

    def missing_files(self, manifest: CommitManifest) -> list[str]:
        """Files the manifest lists that are absent or of the wrong size."""
        base = self.path(manifest.index)
        self.fs.invalidate_cache(base)
        bad = []
        for rel, info in manifest.files.items():
            try:
                size = self.fs.size(fsutil.join(base, rel))
            except FileNotFoundError:
                size = None
            if size != info["size"]:
                bad.append(rel)
        return bad
