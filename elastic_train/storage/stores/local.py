"""Local disk and NFS mounts: atomic renames, appends and hard links exist here.

What is written here survives a power cut only once it is fsynced: a file's bytes by
an fsync of the file, a name made, renamed or removed in a directory by an fsync of
the directory. Every write that must outlast the process (a checkpoint's files, a
commit marker, ``run.json``) is synced both ways before anything depends on it.
"""

from __future__ import annotations

import errno
import os
import stat
import uuid

import fsspec.implementations.local

from elastic_train.errors import StorageError
from elastic_train.storage.stores.base import StoreAdapter

# A file system that cannot fsync a directory (some FUSE and network ones) says so thus.
_NO_DIR_SYNC = (errno.EINVAL, errno.ENOTSUP, errno.EBADF, errno.EACCES, errno.EPERM)


def fsync_path(path: str) -> None:
    """fsyncs the file or directory ``path`` (a directory: the names in it); a file
    system that cannot fsync directories is let be."""
    is_dir = os.path.isdir(path)
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if is_dir else 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        if not (is_dir and exc.errno in _NO_DIR_SYNC):
            raise
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    """What a file that is not a regular one is, in words."""
    kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), f"of mode {mode:o}")


def _parents(path: str, up_to: str) -> list[str]:
    """The directories from ``path``'s own up to and including ``up_to``, deepest first."""
    top = os.path.normpath(up_to)
    parents, directory = [], os.path.dirname(os.path.normpath(path))
    while directory.startswith(top + os.sep):
        parents.append(directory)
        directory = os.path.dirname(directory)
    return [*parents, top] if directory == top else parents


class LocalStore(StoreAdapter):
    """This machine's file system (fsspec's ``file://``)."""

    is_local = True
    appends = True

    def write_bytes_atomic(self, path: str, data: bytes) -> None:
        """Writes a temporary sibling, then renames it over ``path`` (a PUT-like write
        is not atomic on a file system, a rename is)."""
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_path(os.path.dirname(path))  # the rename itself

    def read_bytes(self, path: str, limit: int) -> bytes:
        """As the base's, of regular files only: a FIFO, a device or a socket in a run
        directory is refused (StorageError) before a byte is read -- a read of a FIFO
        that no one writes never ends. fsspec's own local filesystem: opened without
        blocking (the open of a FIFO waits for a writer), then the opened file itself is
        asked what it is. A subclass of it (the user's ``storage_filesystem``, an NFS
        model in the tests) is asked what the path is, then read through its own open."""
        local = self.fs._strip_protocol(path)
        if type(self.fs) is not fsspec.implementations.local.LocalFileSystem:
            _check_regular(os.stat(local).st_mode, local)
            return super().read_bytes(path, limit)
        fd = os.open(local, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            _check_regular(os.fstat(fd).st_mode, local)
            chunks, left = [], limit + 1
            while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def append(self, path: str, data: bytes) -> None:
        with open(path, "ab") as f:
            f.write(data)

    def link_files(self, sources: list[str], targets: list[str]) -> bool:
        """Hard links; False (no link left behind) where the file system cannot, e.g.
        across devices."""
        done = []
        try:
            for source, target in zip(sources, targets, strict=True):
                if os.path.lexists(target):
                    os.unlink(target)  # a leftover of an interrupted attempt at this index
                os.link(source, target)
                done.append(target)
        except OSError:
            for target in done:
                os.unlink(target)
            return False
        return True

    def make_durable(self, paths: list[str], up_to: str) -> None:
        """fsyncs ``paths``, then every directory from theirs up to ``up_to``: their
        bytes and their names survive a power cut (without, a committed marker could
        stand over empty files once the journal had the names and not the data)."""
        directories: dict[str, None] = {}
        for path in paths:
            fsync_path(path)
            directories.update(dict.fromkeys(_parents(path, up_to)))
        for directory in sorted(directories, key=len, reverse=True):
            fsync_path(directory)

    def rename_tree(self, source: str, target: str) -> bool:
        os.rename(source, target)
        for directory in dict.fromkeys((os.path.dirname(target), os.path.dirname(source))):
            fsync_path(directory)
        return True


def _check_regular(mode: int, path: str) -> None:
    """Raises unless ``mode`` is a regular file's (see :meth:`LocalStore.read_bytes`)."""
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    if not stat.S_ISREG(mode):
        raise StorageError(f"{path} is not a regular file but {_kind(mode)}: no file "
                           "elastic-train writes is; move it aside")
