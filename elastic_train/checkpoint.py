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
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import fsspec

from elastic_train.errors import ConfigError
from elastic_train.storage import filesystem as fsutil
from elastic_train.storage.checkpoint_store import MARKER, parse_marker
from elastic_train.storage.local_tier import LocalTier, confined
from elastic_train.storage.manifest import CommitManifest

METADATA_FILE = ".metadata.json"


class Checkpoint:
    """A reference to a checkpoint directory; nothing is copied until asked.

    Args:
        path: The directory, a local path or a path on ``filesystem``.
        filesystem: The fsspec filesystem holding it (default: from the path).
    """

    # Class-level defaults, so that checkpoints pickled by older versions have them too.
    written: Any = None  # the future of files still being written (see from_directory)
    _commit: CommitManifest | None = None  # the commit manifest, once read

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
    def from_directory(cls, path: str | os.PathLike, written: Any = None) -> Checkpoint:
        """A checkpoint of a local directory (which must exist).

        ``written`` (our addition) is a ``concurrent.futures.Future`` that completes
        when the files in ``path`` are all written -- what
        ``torch.distributed.checkpoint.async_save`` returns. ``report()`` then
        returns without waiting for the writes (the training loop blocks only for
        async_save's copy of the state to host memory); the upload starts once the
        future completes, and takes the directory over: leave it alone, it is
        moved away. Each rank's files must have names of their own (DCP's do)::

            written = dcp.async_save(state, checkpoint_id=d, process_group=group)
            elastic_train.report(metrics, checkpoint=Checkpoint.from_directory(d, written))
        """
        path = os.path.abspath(os.fspath(path))
        if not os.path.isdir(path):
            raise ConfigError(
                f"Checkpoint.from_directory({path!r}): no such directory. Save the checkpoint's "
                "files into a directory first, then pass that directory."
            )
        written = getattr(written, "upload_completion", written)  # dcp's AsyncSaveResponse
        if written is not None and not callable(getattr(written, "result", None)):
            raise ConfigError(
                f"Checkpoint.from_directory(written={written!r}): pass the future of the "
                "writes, e.g. written=dcp.async_save(state, checkpoint_id=path, ...).")
        checkpoint = cls(path)
        checkpoint.written = written
        return checkpoint

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
            local = confined(target, rel)  # a name in shared storage never writes outside
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
        is fetched: inside a worker, once per node into its local tier (see
        :mod:`elastic_train.storage.local_tier`), which the node's ranks share and
        which already holds, checked against the commit manifest, the files this
        node uploaded; elsewhere into a temporary directory removed afterwards.
        """
        if self._is_local:
            yield self.path
            return
        tier = LocalTier.of_node()
        if tier is not None:
            with tier.local_copy(self.filesystem, self.path, self.get_commit_info()) as d:
                yield d
            return
        tmp = self.to_directory()
        try:
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def get_commit_info(self) -> CommitManifest | None:
        """What the run recorded when it committed this checkpoint, or None for a
        directory that elastic-train did not commit (our addition; Ray has none).

        ``ranks`` are the ranks whose files it holds, ``size_bytes`` its size,
        ``files`` each file's size, CRC-32 and rank, ``world_size`` the number of
        workers that wrote it::

            info = result.checkpoint.get_commit_info()
            print(info.describe_contents())      # e.g. "400.0 MiB from ranks 0-3"

        A marker elastic-train did not write (malformed, or naming files outside the
        checkpoint) raises :class:`~elastic_train.errors.CorruptManifestError`.
        """
        if self._commit is None:
            try:
                raw = self.filesystem.cat_file(fsutil.join(self.path, MARKER))
            except FileNotFoundError:
                return None
            self._commit = parse_marker(raw, self.path)
        return self._commit

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
        contents = f", {self._commit.describe_contents()}" if self._commit else ""
        return (f"Checkpoint(filesystem={self.filesystem.protocol!r}, path={self.path!r}"
                f"{contents})")

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Checkpoint) and other.path == self.path
                and other.filesystem == self.filesystem)

    def __hash__(self) -> int:
        return hash(self.path)


def committed_checkpoint(path: str, filesystem: fsspec.AbstractFileSystem,
                         manifest: CommitManifest) -> Checkpoint:
    """A checkpoint whose commit manifest the caller has read already."""
    checkpoint = Checkpoint(path, filesystem)
    checkpoint._commit = manifest
    return checkpoint
