"""``Checkpoint``: a directory of files on local disk or any fsspec store.

Mirrors ``ray.train.Checkpoint``::

    with tempfile.TemporaryDirectory() as tmp:
        torch.save(model.state_dict(), os.path.join(tmp, "model.pt"))
        elastic_train.report({"loss": loss}, checkpoint=Checkpoint.from_directory(tmp))

    checkpoint = elastic_train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            model.load_state_dict(torch.load(os.path.join(d, "model.pt")))
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import fsspec

from elastic_train import env_vars
from elastic_train.errors import ConfigError
from elastic_train.storage import filesystem as fsutil
from elastic_train.storage.checkpoint_store import MARKER

METADATA_FILE = ".metadata.json"
# Set for workers: the node-local directory where remote checkpoints are cached.


class Checkpoint:
    """A reference to a checkpoint directory; nothing is copied until asked.

    Args:
        path: The directory, a local path or a path on ``filesystem``.
        filesystem: The fsspec filesystem holding it (default: from the path).
    """

    def __init__(self, path: str | os.PathLike,
                 filesystem: fsspec.AbstractFileSystem | None = None):
        path = os.fspath(path)
        if filesystem is None:
            filesystem, path = fsutil.resolve(path)
        else:  # a URL works as well as the filesystem's own path form
            path = filesystem._strip_protocol(path)
        self.path: str = path
        self.filesystem: fsspec.AbstractFileSystem = filesystem

    @classmethod
    def from_directory(cls, path: str | os.PathLike) -> Checkpoint:
        """A checkpoint of a local directory (which must exist)."""
        path = os.path.abspath(os.fspath(path))
        if not os.path.isdir(path):
            raise ConfigError(
                f"Checkpoint.from_directory({path!r}): no such directory. Save the checkpoint's "
                "files into a directory first, then pass that directory."
            )
        return cls(path)

    @property
    def _is_local(self) -> bool:
        return fsutil.is_local(self.filesystem)

    def to_directory(self, path: str | os.PathLike | None = None) -> str:
        """Copies the checkpoint's files into ``path`` (default: a new temporary directory)."""
        target = os.fspath(path) if path is not None else tempfile.mkdtemp(prefix="checkpoint_")
        os.makedirs(target, exist_ok=True)
        source = self.path.rstrip("/")
        for remote in self.filesystem.find(source):
            rel = remote[len(source):].lstrip("/")
            if rel == MARKER:
                continue
            local = os.path.join(target, rel)
            os.makedirs(os.path.dirname(local), exist_ok=True)
            if self._is_local:
                shutil.copyfile(remote, local)
            else:
                self.filesystem.get_file(remote, local)
        return target

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[str]:
        """A local directory with the checkpoint's files, for the duration of the block.

        A local checkpoint is yielded in place (do not modify it). A remote one
        is downloaded: inside a worker, once per node into the run's node-local
        cache, which the node's ranks share; elsewhere into a temporary
        directory that is removed afterwards.
        """
        if self._is_local:
            yield self.path
            return
        cached = self._cached_copy()
        if cached is not None:
            yield cached
            return
        tmp = self.to_directory()
        try:
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _cache_entry(self) -> str | None:
        root = os.environ.get(env_vars.CHECKPOINT_CACHE)
        if not root:
            return None
        url = self.filesystem.unstrip_protocol(self.path)
        return os.path.join(root, hashlib.sha256(url.encode()).hexdigest()[:20])

    def _cached_copy(self) -> str | None:
        """The node's copy of this checkpoint, downloaded by the first rank that asks."""
        entry = self._cache_entry()
        if entry is None:
            return None
        os.makedirs(os.path.dirname(entry), exist_ok=True)
        with open(entry + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not os.path.exists(entry + ".complete"):
                shutil.rmtree(entry, ignore_errors=True)
                self.to_directory(entry)
                open(entry + ".complete", "w").close()
        return entry

    def drop_cached_copy(self) -> None:
        """Forgets the node's copy (e.g. after it failed verification)."""
        entry = self._cache_entry()
        if entry is not None:
            with contextlib.suppress(FileNotFoundError):
                os.remove(entry + ".complete")
            shutil.rmtree(entry, ignore_errors=True)

    def without_credentials(self) -> Checkpoint:
        """This checkpoint on a filesystem holding no secrets: what a run stores of it
        (``trainable.pkl``). :meth:`rebound` gives it credentials again."""
        return Checkpoint(self.path, fsutil.without_secrets(self.filesystem))

    def rebound(self, filesystem: fsspec.AbstractFileSystem) -> Checkpoint:
        """This checkpoint read through ``filesystem`` (and its credentials) when that
        reaches the same store; otherwise unchanged."""
        if fsutil.same_store(self.filesystem, filesystem):
            return Checkpoint(self.path, filesystem)
        return self

    def get_metadata(self) -> dict[str, Any]:
        """The checkpoint's metadata dict (empty when none was set)."""
        try:
            with self.filesystem.open(fsutil.join(self.path, METADATA_FILE), "rb") as f:
                return json.loads(f.read())
        except FileNotFoundError:
            return {}

    def set_metadata(self, metadata: dict[str, Any]) -> None:
        """Replaces the metadata; it must be JSON-serialisable."""
        try:
            data = json.dumps(metadata).encode()
        except TypeError as exc:
            raise ConfigError(f"Checkpoint metadata must be JSON-serialisable: {exc}") from exc
        fsutil.write_bytes_atomic(self.filesystem, fsutil.join(self.path, METADATA_FILE), data)

    def update_metadata(self, metadata: dict[str, Any]) -> None:
        """Merges ``metadata`` into the existing metadata."""
        self.set_metadata({**self.get_metadata(), **metadata})

    def __repr__(self) -> str:
        return f"Checkpoint(filesystem={self.filesystem.protocol!r}, path={self.path!r})"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Checkpoint) and other.path == self.path
                and other.filesystem == self.filesystem)

    def __hash__(self) -> int:
        return hash(self.path)
