"""Local disk that fills up: once ``full_flag`` exists, every write fails with ENOSPC.

A disk that fills mid-run is a fault below the train function that no retry passes.
:class:`FullDiskFS` models it for tests as fsspec's local filesystem under a protocol of
its own (``fulldisk``, so that the run's store adapter is the generic one, which writes
through the filesystem's methods); every process of the run (driver, workers) sees the
disk fill at once when a test -- or a train function -- creates the flag file.

Example::

    fs = FullDiskFS(str(tmp_path / "full"))
    RunConfig(storage_path=str(tmp_path / "results"), storage_filesystem=fs)
    fill(fs)   # from now on every write raises OSError(ENOSPC)
"""

from __future__ import annotations

import errno
import os

from fsspec.implementations.local import LocalFileSystem


class FullDiskFS(LocalFileSystem):
    """fsspec's local filesystem whose writes fail with ENOSPC once ``full_flag`` exists."""

    protocol = ("fulldisk",)

    def __init__(self, full_flag: str, **kwargs):
        super().__init__(auto_mkdir=True, **kwargs)  # as an object store: no directories
        self.full_flag = full_flag

    def _full(self, path: str) -> None:
        if os.path.exists(self.full_flag):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self._strip_protocol(path))

    def _open(self, path, mode="rb", **kwargs):
        if "r" not in mode or "+" in mode:
            self._full(path)
        return super()._open(path, mode=mode, **kwargs)

    def put_file(self, lpath, rpath, **kwargs):
        self._full(rpath)
        return super().put_file(lpath, rpath, **kwargs)

    def cp_file(self, path1, path2, **kwargs):
        self._full(path2)
        return super().cp_file(path1, path2, **kwargs)


def fill(fs: FullDiskFS) -> None:
    """The disk is full from now on, for every process of the run."""
    with open(fs.full_flag, "w"):
        pass
