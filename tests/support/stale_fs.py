"""Local disk as a node's NFS client sees it: stale negative lookups, slow upload markers.

An NFS client caches "not found" (a negative dentry) and keeps answering it until
the parent directory's cached attributes expire (``acdirmin``, 30 s by default),
even after another node created the file. Opening the directory revalidates it
(close-to-open consistency): a listing shows what the server has, and the stale
negative entries of its children are dropped. :class:`NodeCacheFS` models that
for tests, per *node*: the processes of one node (a driver, its zygote and
workers, which inherit ``STALE_FS_NODE``) share one negative cache through files
under ``cache_dir``. Processes without ``STALE_FS_NODE`` see plain local disk.

``slow_marks_s`` makes every read of an upload marker take that long (a slow
store), so each checkpoint stays reported-but-uncommitted for a while.
``only_suffix`` limits the stale answers to paths ending so (e.g. ``.commit.json``:
on one machine the driver and rank 0 are one NFS client, whose own creations would
replace its cached "not found"; limited to commit markers, the model is the worst
case of markers written by another node).

Example::

    fs = NodeCacheFS(str(tmp_path / "nfs-cache"), negative_ttl_s=30.0, slow_marks_s=1.0)
    RunConfig(storage_path=str(tmp_path / "results"), storage_filesystem=fs)
"""

from __future__ import annotations

import hashlib
import os
import time

from fsspec.implementations.local import LocalFileSystem

NODE_ENV = "STALE_FS_NODE"


class NodeCacheFS(LocalFileSystem):
    """fsspec's local filesystem with one node's NFS negative-lookup cache (see module)."""

    def __init__(self, cache_dir: str, negative_ttl_s: float = 30.0, slow_marks_s: float = 0.0,
                 only_suffix: str = "", **kwargs):
        super().__init__(**kwargs)
        self.cache_dir = cache_dir
        self.negative_ttl_s = negative_ttl_s
        self.slow_marks_s = slow_marks_s
        self.only_suffix = only_suffix

    # the node's negative cache: one file per entry, named by the path's hash
    def _entries(self) -> str | None:
        node = os.environ.get(NODE_ENV)
        if node is None or self.negative_ttl_s <= 0:
            return None
        directory = os.path.join(self.cache_dir, node)
        os.makedirs(directory, exist_ok=True)
        return directory

    def _entry(self, path: str) -> str | None:
        directory = self._entries()
        if directory is None or not path.endswith(self.only_suffix):
            return None
        return os.path.join(directory, hashlib.sha1(path.encode()).hexdigest())

    def _cached_negative(self, path: str) -> bool:
        entry = self._entry(path)
        try:
            return entry is not None and time.time() - os.path.getmtime(entry) \
                < self.negative_ttl_s
        except FileNotFoundError:
            return False

    def _remember_negative(self, path: str) -> None:
        entry = self._entry(path)
        if entry is not None and not os.path.exists(entry):
            with open(entry, "w") as f:
                f.write(path)

    def _lookup(self, path: str, real):
        path = self._strip_protocol(path)
        if self._cached_negative(path):
            raise FileNotFoundError(path)
        try:
            return real()
        except FileNotFoundError:
            self._remember_negative(path)
            raise

    def info(self, path, **kwargs):
        return self._lookup(path, lambda: super(NodeCacheFS, self).info(path, **kwargs))

    def _open(self, path, mode="rb", **kwargs):
        if "r" not in mode:
            return super()._open(path, mode=mode, **kwargs)
        if self.slow_marks_s and "/.upload-marks/" in self._strip_protocol(path):
            time.sleep(self.slow_marks_s)
        return self._lookup(path, lambda: super(NodeCacheFS, self)._open(path, mode=mode,
                                                                         **kwargs))

    def ls(self, path, detail=False, **kwargs):
        """A listing goes to the server and revalidates the directory: the node's stale
        negative entries of its children are dropped."""
        listing = super().ls(path, detail=detail, **kwargs)
        directory = self._entries()
        if directory is not None:
            parent = self._strip_protocol(path).rstrip("/")
            for name in os.listdir(directory):
                entry = os.path.join(directory, name)
                try:
                    with open(entry) as f:
                        cached = f.read()
                except FileNotFoundError:
                    continue
                if os.path.dirname(cached) == parent:
                    try:
                        os.unlink(entry)
                    except FileNotFoundError:
                        pass
        return listing
