"""A disk that forgets at a power cut what was never made durable, for tests.

:class:`PowerCutDisk` watches the real files under ``root`` while code runs inside
``with disk.recording():``. It numbers the *steps* (every link, rename, unlink,
mkdir, rmdir, copy and fsync that touches a path under ``root``; a file created by
``open()`` joins the next step) and keeps, after each, what the tree held. Operations
on other paths are no steps (they leave the tree as it was), but an fsync of any
regular file records its bytes, which a later rename may bring under ``root``. What a
power cut after step ``k`` leaves (:meth:`after_cut`) follows the rules a journaling
file system keeps (ext4 with delayed allocation) and POSIX promises, taken at their worst:

- a file's bytes survive only as of its last ``fsync`` (a file never synced is
  empty);
- changes to directory entries (create, link, rename, unlink) reach the disk in
  the order they were made, up to any point ``s <= k`` (the journal's prefix);
- ``fsync`` of a directory makes its entries as of that moment durable.

Inodes are kept alive in a side directory (hard links), so that an inode number
names one file for the whole test. Linux only (``/proc/self/fd``).

It records one process (the hooks replace ``os``'s functions in it, for every
thread): in the chaos suite's ``power_cut_commit`` the worker that commits
checkpoints (:mod:`tests.support.power_cut_job`), whose ``on_step`` callback cuts
the power at a step of a commit. What other processes write under ``root`` shows in
the snapshots, but their fsyncs are not seen (so the model takes their bytes as never
synced): the trial uses only the part of the tree that the recorded process writes.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import stat
import threading
from collections.abc import Callable, Iterator

# {relative directory ("" for the root): {name: inode number, or None for a directory}}
Snapshot = dict[str, dict[str, int | None]]

_HOOKED_OS = ("link", "rename", "replace", "unlink", "remove", "rmdir", "mkdir")
# Which keyword names the directory a relative path of positional argument i is in.
_DIR_FD_KEYS = (("src_dir_fd", "dir_fd"), ("dst_dir_fd",))


def _fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


class PowerCutDisk:
    """The durable state of the files under ``root`` after each step of the code recorded."""

    def __init__(self, root: str, graveyard: str):
        self.root = root
        self.graveyard = graveyard
        os.makedirs(graveyard, exist_ok=True)
        self._os = {name: getattr(os, name) for name in (*_HOOKED_OS, "fsync")}
        self._copyfile = shutil.copyfile
        self.snapshots: list[Snapshot] = []
        self.ops: list[str] = []  # what each step did, e.g. "replace checkpoint_000002/..."
        self.dir_syncs: dict[str, list[int]] = {}
        self.data: dict[int, list[tuple[int, bytes]]] = {}
        self._lock = threading.RLock()
        self._step("start")
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

    def _inside(self, path: str) -> str | None:
        """``path`` relative to ``root`` ("" for the root), or None if it is not under it."""
        rel = os.path.relpath(os.path.abspath(path), self.root)
        if rel == ".":
            return ""
        return None if rel == ".." or rel.startswith(".." + os.sep) else rel

    def _paths_under_root(self, args: tuple, kwargs: dict) -> list[str]:
        """The paths among an operation's first two arguments that are under ``root``
        (relative; a relative path with a ``dir_fd`` resolved through it)."""
        found = []
        for i, arg in enumerate(args[:2]):
            if not isinstance(arg, (str, bytes, os.PathLike)):
                continue
            path = os.fsdecode(arg)
            fd = next((kwargs[k] for k in _DIR_FD_KEYS[i] if kwargs.get(k) is not None), None)
            if fd is not None and not os.path.isabs(path):
                path = os.path.join(_fd_path(fd), path)
            rel = self._inside(path)
            if rel is not None:
                found.append(rel or ".")
        return found

    def _step(self, what: str) -> int:
        with self._lock:
            return self._snapshot(what)

    def _snapshot(self, what: str) -> int:
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
        self.ops.append(what)
        return len(self.snapshots) - 1

    def _fsync(self, fd, on_step: Callable[[int], None] | None = None) -> None:
        fd = fd if isinstance(fd, int) else fd.fileno()
        info = os.fstat(fd)
        rel = self._inside(_fd_path(fd))
        if rel is None and not stat.S_ISREG(info.st_mode):
            self._os["fsync"](fd)  # a directory elsewhere: the tree does not change
            return
        with self._lock:
            # An fsync elsewhere is no step: its bytes count from the next one on.
            step = self._snapshot(f"fsync {rel or '.'}") if rel is not None \
                else len(self.snapshots)
            self._os["fsync"](fd)
            if stat.S_ISDIR(info.st_mode):
                self.dir_syncs.setdefault(rel, []).append(step)
            elif stat.S_ISREG(info.st_mode):
                with open(f"/proc/self/fd/{fd}", "rb") as f:
                    self.data.setdefault(info.st_ino, []).append((step, f.read()))
            if rel is not None and on_step is not None:
                on_step(step)

    @contextlib.contextmanager
    def recording(self, on_step: Callable[[int], None] | None = None
                  ) -> Iterator[PowerCutDisk]:
        """Records every step made in the block (in any thread). ``on_step(step)`` is
        called after each, before any other thread may make one (``self.ops[step]``
        says what it did)."""
        def stepping(name, original):
            def op(*args, **kwargs):
                paths = self._paths_under_root(args, kwargs)
                if not paths:
                    return original(*args, **kwargs)
                with self._lock:
                    try:
                        return original(*args, **kwargs)
                    finally:
                        step = self._snapshot(f"{name} {' -> '.join(paths)}")
                        if on_step is not None:
                            on_step(step)
            return op

        saved = {name: getattr(os, name) for name in (*_HOOKED_OS, "fsync")}
        try:
            for name in _HOOKED_OS:
                setattr(os, name, stepping(name, self._os[name]))
            os.fsync = lambda fd: self._fsync(fd, on_step)
            shutil.copyfile = stepping("copyfile", self._copyfile)
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


def tree_to_json(tree: dict[str, bytes | None]) -> dict[str, str | None]:
    """:meth:`PowerCutDisk.after_cut`'s tree as JSON (bytes in base64), for another process."""
    return {rel: None if data is None else base64.b64encode(data).decode()
            for rel, data in tree.items()}


def tree_from_json(data: dict[str, str | None]) -> dict[str, bytes | None]:
    return {rel: None if text is None else base64.b64decode(text) for rel, text in data.items()}


def materialize(tree: dict[str, bytes | None], target: str) -> None:
    """Writes what :meth:`PowerCutDisk.after_cut` left under ``target`` (created if needed;
    what is there already stays)."""
    os.makedirs(target, exist_ok=True)
    for rel, content in sorted(tree.items()):
        path = os.path.join(target, rel)
        if content is None:
            os.makedirs(path, exist_ok=True)
        else:
            with open(path, "wb") as f:
                f.write(content)
