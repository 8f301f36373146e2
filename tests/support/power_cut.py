"""A disk that forgets at a power cut what was never made durable, for unit tests.

:class:`PowerCutDisk` watches the real files under ``root`` while code runs inside
``with disk.recording():``. It numbers the *steps* (every link, rename, unlink,
mkdir, rmdir, copy and fsync; a file created by ``open()`` joins the next step)
and keeps, after each, what the tree held. What a power cut after step ``k``
leaves (:meth:`after_cut`) follows the rules a journaling file system keeps
(ext4 with delayed allocation) and POSIX promises, taken at their worst:

- a file's bytes survive only as of its last ``fsync`` (a file never synced is
  empty);
- changes to directory entries (create, link, rename, unlink) reach the disk in
  the order they were made, up to any point ``s <= k`` (the journal's prefix);
- ``fsync`` of a directory makes its entries as of that moment durable.

Inodes are kept alive in a side directory (hard links), so that an inode number
names one file for the whole test. Linux only (``/proc/self/fd``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Iterator

# {relative directory ("" for the root): {name: inode number, or None for a directory}}
Snapshot = dict[str, dict[str, int | None]]

_HOOKED_OS = ("link", "rename", "replace", "unlink", "remove", "rmdir", "mkdir")


class PowerCutDisk:
    """The durable state of the files under ``root`` after each step of the code recorded."""

    def __init__(self, root: str, graveyard: str):
        self.root = root
        self.graveyard = graveyard
        os.makedirs(graveyard, exist_ok=True)
        self._os = {name: getattr(os, name) for name in (*_HOOKED_OS, "fsync")}
        self._copyfile = shutil.copyfile
        self.snapshots: list[Snapshot] = []
        self.dir_syncs: dict[str, list[int]] = {}
        self.data: dict[int, list[tuple[int, bytes]]] = {}
        self._step()
        for files in self.snapshots[0].values():  # what was there before is on disk
            for ino in files.values():
                if ino is not None:
                    self.data[ino] = [(0, self._content_of(ino))]

    @property
    def steps(self) -> int:
        return len(self.snapshots)

    def _content_of(self, ino: int) -> bytes:
        with open(os.path.join(self.graveyard, str(ino)), "rb") as f:
            return f.read()

    def _step(self) -> int:
        snapshot: Snapshot = {}
        for directory, dirs, files in os.walk(self.root):
            rel = os.path.relpath(directory, self.root)
            rel = "" if rel == "." else rel
            entries: dict[str, int | None] = dict.fromkeys(dirs)
            for name in files:
                path = os.path.join(directory, name)
                with contextlib.suppress(FileNotFoundError):
                    ino = os.lstat(path).st_ino
                    keep = os.path.join(self.graveyard, str(ino))
                    if not os.path.exists(keep):
                        self._os["link"](path, keep)
                    entries[name] = ino
            snapshot[rel] = entries
        self.snapshots.append(snapshot)
        return len(self.snapshots) - 1

    def _fsync(self, fd: int) -> None:
        step = self._step()
        self._os["fsync"](fd)
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            rel = os.path.relpath(os.readlink(f"/proc/self/fd/{fd}"), self.root)
            if not rel.startswith(".."):
                self.dir_syncs.setdefault("" if rel == "." else rel, []).append(step)
        elif stat.S_ISREG(info.st_mode):
            with open(f"/proc/self/fd/{fd}", "rb") as f:
                self.data.setdefault(info.st_ino, []).append((step, f.read()))

    @contextlib.contextmanager
    def recording(self) -> Iterator[PowerCutDisk]:
        """Records every step made in the block (in any thread)."""
        def stepping(original):
            def op(*args, **kwargs):
                try:
                    return original(*args, **kwargs)
                finally:
                    self._step()
            return op

        saved = {name: getattr(os, name) for name in (*_HOOKED_OS, "fsync")}
        try:
            for name in _HOOKED_OS:
                setattr(os, name, stepping(self._os[name]))
            os.fsync = self._fsync
            shutil.copyfile = stepping(self._copyfile)
            yield self
        finally:
            for name, original in saved.items():
                setattr(os, name, original)
            shutil.copyfile = self._copyfile

    def _synced_at(self, rel: str, cut: int) -> int:
        return max((s for s in self.dir_syncs.get(rel, ()) if s <= cut), default=0)

    def _bytes(self, ino: int, cut: int) -> bytes:
        return next((data for step, data in reversed(self.data.get(ino, ()))
                     if step <= cut), b"")

    def after_cut(self, cut: int, journal: int) -> dict[str, bytes | None]:
        """``{relative path: bytes, or None for a directory}`` left by a power cut after
        step ``cut`` when the journal had reached step ``journal`` (<= ``cut``)."""
        tree: dict[str, bytes | None] = {}

        def walk(rel: str) -> None:
            entries = self.snapshots[max(journal, self._synced_at(rel, cut))].get(rel, {})
            for name, ino in entries.items():
                path = os.path.join(rel, name) if rel else name
                if ino is None:
                    tree[path] = None
                    walk(path)
                else:
                    tree[path] = self._bytes(ino, cut)

        walk("")
        return tree


def materialize(tree: dict[str, bytes | None], target: str) -> None:
    """Writes what :meth:`PowerCutDisk.after_cut` left under ``target`` (a new directory)."""
    os.makedirs(target)
    for rel, content in sorted(tree.items()):
        path = os.path.join(target, rel)
        if content is None:
            os.makedirs(path, exist_ok=True)
        else:
            with open(path, "wb") as f:
                f.write(content)
