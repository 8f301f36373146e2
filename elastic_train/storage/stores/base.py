"""The adapter interface, with the behaviour that serves any fsspec store.

A :class:`StoreAdapter` wraps one fsspec filesystem and answers what differs
between stores: options when opening, whether a rename or an append exists,
how to write a file atomically, how a directory tree goes away, what an
interrupted upload leaves, and which errors mean the store is briefly
unavailable. The defaults here assume as little as fsspec promises (every
write one ``pipe_file``, no rename, no append, nothing left behind by a cut
upload); a store that does better, or differently, overrides them in its own
module (``local.py``, ``s3.py``). Which adapter a filesystem gets is decided
in one place, :mod:`elastic_train.storage.stores`.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable
from datetime import datetime
from typing import Any, ClassVar

import fsspec


class StoreAdapter:
    """What one store does its own way; the defaults serve any fsspec store (``memory://``).

    Example::

        store = adapter_for(fs)
        store.write_bytes_atomic(f"{run}/run.json", data)
        store.remove_tree(f"{run}/checkpoint_000003")
    """

    #: True when paths are this machine's files (local disk, NFS mounts): readers use
    #: them in place, and the run's logs are written straight into the run directory.
    is_local: ClassVar[bool] = False

    #: True when :meth:`append` adds to a file in place; False where a file is written
    #: whole (an object store), where an append-only log goes to segments instead
    #: (:mod:`elastic_train.storage.jsonl_log`).
    appends: ClassVar[bool] = False

    #: What to check when the store cannot be read at all (said with the error).
    access_hint: ClassVar[str] = "check the path and that you may read it"

    def __init__(self, fs: fsspec.AbstractFileSystem):
        self.fs = fs

    @classmethod
    def filesystem_options(cls, options: dict[str, Any] | None) -> dict[str, Any]:
        """The arguments the filesystem is built with from a URL, given the user's."""
        return dict(options or {})

    def configure(self) -> None:
        """Settings of a filesystem just built from a URL that are not arguments."""

    def endpoint(self) -> Any:
        """Where the store is (e.g. an ``endpoint_url``), to tell two stores of a kind apart."""
        return self.fs.storage_options.get("endpoint_url")

    def transient(self, exc: BaseException) -> bool:
        """Whether this one exception carries this store's sign of a passing fault
        (throttling, a 5xx); the signs all stores share are in
        :func:`~elastic_train.storage.retry.is_transient`."""
        return False

    def modified(self, info: dict[str, Any]) -> float | None:
        """The store's modification time (seconds since the epoch) of a file, from its
        ``ls(detail=True)`` entry; None where the store gives none. Local disk and NFS
        give ``mtime``, S3 ``LastModified``."""
        for key in ("mtime", "LastModified", "last_modified", "modified", "created"):
            value = info.get(key)
            if isinstance(value, datetime):
                return value.timestamp()
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
        return None

    def version(self, info: dict[str, Any]) -> Hashable:
        """What changes whenever a file's bytes do, from its ``ls(detail=True)`` entry: a
        reader keeps what it read under it (here the size and modification time)."""
        return info.get("size"), self.modified(info)

    def read_bytes(self, path: str, limit: int) -> bytes:
        """The file ``path`` whole, in one read as the store holds it now (``cat_file``:
        no file object, which s3fs opens with the ETag its listing cache holds); at most
        ``limit`` bytes and one more, which tells the caller the file is larger. An
        object store holds only regular files, so no other kind is looked for."""
        return self.fs.cat_file(path, start=0, end=limit + 1)

    def write_bytes_atomic(self, path: str, data: bytes) -> None:
        """Writes ``path`` so that readers see the old content or the new, never a part:
        one PUT is atomic on an object store."""
        self.fs.pipe_file(path, data)

    def append(self, path: str, data: bytes) -> None:
        """Appends ``data`` to ``path``; asked only of a store that :attr:`appends`."""
        raise NotImplementedError(f"{type(self).__name__} cannot append")

    def link_files(self, sources: list[str], targets: list[str]) -> bool:
        """Places local files ``sources`` at ``targets`` without copying where the store
        can (nothing is left behind when it cannot); False: the caller uploads them."""
        return False

    def make_durable(self, paths: list[str], up_to: str) -> None:
        """Makes the files (or directories) ``paths``, and their names in every directory
        up to ``up_to``, survive a power cut. A completed PUT is durable on an object
        store: nothing to do."""

    def rename_tree(self, source: str, target: str) -> bool:
        """Moves a directory tree in one atomic step where the store can; False where it
        cannot (the caller copies, checks the copy, then deletes)."""
        return False

    def put_options(self) -> dict[str, Any]:
        """Extra ``fs.put`` arguments for checkpoint files (e.g. bounding memory)."""
        return {}

    def missing_bucket(self, path: str) -> str | None:
        """The bucket of ``path`` when the store has buckets and that one does not exist."""
        return None

    def remove_tree(self, path: str) -> None:
        """Removes ``path`` and everything below it; a path already gone is fine (a retry)."""
        try:
            self.fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass

    def abort_unfinished_uploads(self, path: str, only: Collection[str] | None = None) -> int:
        """Aborts the partial uploads under ``path`` that a killed writer left (only to
        ``only``'s paths when given); returns how many. Stores without them: 0."""
        return 0
