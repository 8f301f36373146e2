"""The node's local tier: checkpoint files kept on this machine's disk, so that a
restart on a node that survived reads them there instead of downloading them.

Each node (the driver of ``fit()``, or an ``elastic-train launch`` agent) has one
directory in its scratch space, shared by its workers (its path reaches them in the
worker plan, see :mod:`.node_settings`). For checkpoints on a remote store it holds:

* the files this node's ranks uploaded: once a rank's upload is done, the uploader
  moves its staged copy in (a rename, nothing copied) instead of deleting it;
* files downloaded when a rank of the node needs them (the check before a restart,
  ``Checkpoint.as_directory()``; :class:`~elastic_train.storage.dcp.CheckpointReader`
  reads only verified files here and fetches byte ranges of the others).

A file is used only once it matches the checkpoint's commit manifest (size,
CRC-32 and SHA-256): a kept file is checked at its first use, a download as it
arrives. A kept file (the node's own upload, or a peer's copy) is trusted only
against a SHA-256; for a manifest with CRC-32s only, the file is downloaded again. An
entry goes when it is superseded -- as soon as a newer checkpoint of the run is
known to be committed, and at a restart every entry of the run but the
checkpoint resumed from -- and with the scratch space when the node's run ends.
So a node holds its ranks' share of the newest committed checkpoint and of the
few after it that are still being uploaded or committed (``report()`` waits when
uploads fall behind), and what it downloaded of the checkpoint it resumed from.
A replacement node starts empty and downloads what it needs.
``ELASTIC_TRAIN_LOCAL_TIER=0`` (:data:`elastic_train._internal.env_vars.LOCAL_TIER`, in the
driver's or launch's environment, read into the worker plan) stops keeping uploads,
for nodes short of disk.

One entry per checkpoint directory URL::

    <root>/<hash of the run URL>/checkpoint_000007/         verified files
    <root>/<hash of the run URL>/checkpoint_000007.kept/    moved in from staging, unchecked
    <root>/<hash of the run URL>/checkpoint_000007.complete every file is verified
    <root>/<hash of the run URL>/checkpoint_000007.lock     flock: exclusive to fill or
                                                            remove, shared while read
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

import fsspec

from elastic_train.errors import CorruptManifestError, StorageError
from elastic_train.storage import filesystem as fsutil
from elastic_train.storage import node_settings
from elastic_train.storage.checkpoint_store import MARKER, dir_name, file_matches
from elastic_train.storage.manifest import CommitManifest, FileDigest, check_relpath, is_trusted
from elastic_train.storage.retry import RetryPolicy, run_policy
from elastic_train.storage.stores import adapter_for

if TYPE_CHECKING:
    from elastic_train.storage.peer_replicas import PeerRing

logger = logging.getLogger(__name__)

_INDEX_RE = re.compile(r"^checkpoint_(\d{6,})$")


@dataclass(frozen=True)
class TierEntry:
    """The local paths of one checkpoint directory's entry."""

    base: str

    @property
    def verified(self) -> str:
        return self.base

    @property
    def kept(self) -> str:
        return self.base + ".kept"

    @property
    def complete(self) -> str:
        return self.base + ".complete"

    @property
    def lockfile(self) -> str:
        return self.base + ".lock"

    @contextlib.contextmanager
    def locked(self, mode: int) -> Iterator[IO[str]]:
        """Holds the entry's flock (``fcntl.LOCK_SH`` or ``LOCK_EX``) for the block."""
        os.makedirs(os.path.dirname(self.base), exist_ok=True)
        lock = _open_locked(self.lockfile, mode)
        assert lock is not None  # a blocking lock is always had
        with lock:
            yield lock


def _open_locked(path: str, mode: int) -> IO[str] | None:
    """``path`` opened and flock'ed with ``mode``; None if ``LOCK_NB`` and it is held.
    A lock got on a file that a remover unlinked while we waited locks nothing (the
    next opener creates a new file), so then it opens the file again."""
    while True:
        lock = open(path, "a")  # noqa: SIM115 -- returned open
        try:
            fcntl.flock(lock, mode)
        except BlockingIOError:
            lock.close()
            return None
        except BaseException:
            lock.close()
            raise
        if _is_current(lock, path):
            return lock
        lock.close()


def _is_current(lock: IO[str], path: str) -> bool:
    """Whether the open ``lock`` is still the file at ``path`` (not unlinked)."""
    try:
        at_path, held = os.stat(path), os.fstat(lock.fileno())
    except FileNotFoundError:
        return False
    return (at_path.st_dev, at_path.st_ino) == (held.st_dev, held.st_ino)


def confined(base: str, rel: str) -> str:
    """``base/rel``, where ``rel`` comes from a manifest or a listing of shared storage:
    :class:`CorruptManifestError` unless it is a relative path with no ``..``
    (:func:`~.manifest.check_relpath`) that resolves, symbolic links followed, inside
    ``base``. Nothing a marker or a store's listing says is written outside ``base``."""
    target = os.path.join(base, check_relpath(rel))
    real_base = os.path.realpath(base)
    if os.path.commonpath([real_base, os.path.realpath(target)]) != real_base:
        raise CorruptManifestError(f"{rel!r} resolves outside {base}")
    return target


def copy_checked(fs: fsspec.AbstractFileSystem, remote: str, out: IO[bytes] | None,
                 info: dict[str, Any] | None) -> bool:
    """Streams ``remote`` into ``out`` (or nowhere) computing its checksums on the way;
    whether it matches ``info`` (True when there is nothing to match). Stops at the
    first byte past the size ``info`` names."""
    digest = FileDigest()
    with fs.open(remote, "rb", block_size=fsutil.CHUNK * 8) as f:
        while chunk := f.read(fsutil.CHUNK * 8):
            digest.update(chunk)
            if info is not None and digest.size > info["size"]:
                return False
            if out is not None:
                out.write(chunk)
    return info is None or digest.matches(info)


def run_group(fs: fsspec.AbstractFileSystem, run_path: str) -> str:
    """The name of a run's directory in every node's tier: a hash of the run's URL."""
    url = fs.unstrip_protocol(run_path.rstrip("/"))
    return hashlib.sha256(url.encode()).hexdigest()[:16]


class LocalTier:
    """One node's local tier (see the module docstring).

    Example::

        tier = LocalTier.of_node()           # None outside a worker of fit()/launch
        with tier.local_copy(fs, path, manifest) as d:
            state = torch.load(os.path.join(d, "state.pt"))
    """

    def __init__(self, root: str, retry: RetryPolicy | None = None,
                 peers: PeerRing | None = None):
        self.root = root
        self.retry = retry or RetryPolicy()
        self.peers = peers

    @classmethod
    def of_node(cls) -> LocalTier | None:
        """The tier of this node's run, as its workers see it, with the peers that hold
        copies of its files; None elsewhere."""
        settings = node_settings.current()
        return cls(settings.tier_root, run_policy(), settings.peers) \
            if settings.tier_root else None

    @classmethod
    def for_uploads(cls) -> LocalTier | None:
        """The tier this node's uploads are kept in: :meth:`of_node`, unless
        ``ELASTIC_TRAIN_LOCAL_TIER=0`` turns keeping off."""
        return cls.of_node() if node_settings.current().keep_uploads else None

    def _retry(self, fs: fsspec.AbstractFileSystem) -> RetryPolicy:
        """The tier's policy, retrying what ``fs``'s store says passes as well."""
        return self.retry.for_store(adapter_for(fs))

    def _group(self, fs: fsspec.AbstractFileSystem, parent: str) -> str:
        return os.path.join(self.root, run_group(fs, parent))

    def entry(self, fs: fsspec.AbstractFileSystem, path: str,
              index: int | None = None) -> TierEntry:
        """The entry of the checkpoint at ``path``, named by its ``index`` when known (so
        that one with a custom directory name is pruned by index too), else by its name."""
        parent, _, name = path.rstrip("/").rpartition("/")
        return TierEntry(os.path.join(self._group(fs, parent),
                                      name if index is None else dir_name(index)))

    # the uploader's side
    def keep(self, fs: fsspec.AbstractFileSystem, path: str, staged_dir: str,
             relpaths: list[str], index: int | None = None) -> None:
        """Moves a rank's staged files of checkpoint ``path`` (``index``) into its entry."""
        kept = self.entry(fs, path, index).kept
        for rel in relpaths:
            target = confined(kept, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.replace(os.path.join(staged_dir, rel), target)

    def prune(self, fs: fsspec.AbstractFileSystem, run_path: str,
              keep: Callable[[int], bool]) -> None:
        """Removes the run's entries whose checkpoint index ``keep`` rejects; an entry
        being read (or filled) right now stays until the next prune."""
        group = self._group(fs, run_path)
        for index in self._indices(group):
            if not keep(index):
                self._remove(TierEntry(os.path.join(group, dir_name(index))))

    @staticmethod
    def _indices(group: str) -> set[int]:
        """The checkpoint indices with an entry (or part of one) in ``group``."""
        try:
            names = os.listdir(group)
        except FileNotFoundError:
            return set()
        return {int(m.group(1)) for n in names if (m := _INDEX_RE.match(n.split(".", 1)[0]))}

    @staticmethod
    def _remove(entry: TierEntry) -> None:
        lock = _open_locked(entry.lockfile, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if lock is None:  # being read or filled
            return
        with lock:
            with contextlib.suppress(FileNotFoundError):
                os.remove(entry.complete)
            shutil.rmtree(entry.verified, ignore_errors=True)
            shutil.rmtree(entry.kept, ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):  # another rank's prune got there
                os.remove(entry.lockfile)

    def supersede(self, fs: fsspec.AbstractFileSystem, run_path: str,
                  is_committed: Callable[[int], bool]) -> None:
        """Drops the run's entries older than the newest one that ``is_committed``
        (asked newest first, so usually once or twice)."""
        indices = sorted(self._indices(self._group(fs, run_path)), reverse=True)
        newest = next((i for i in indices if is_committed(i)), None)
        if newest is not None:
            logger.debug("Local tier: dropping entries before %s", dir_name(newest))
            self.prune(fs, run_path, lambda index: index >= newest)

    # the readers' side
    def local_file(self, entry: TierEntry, rel: str, info: dict[str, Any]) -> str | None:
        """The verified local copy of ``rel``, verifying a kept one first; None if the
        node has no good copy (a kept file that does not match is deleted), or only a
        kept one and a manifest without a SHA-256 to check it against.

        The kept file is moved out of the kept files before it is checked, and the
        checked file is what becomes verified: a peer's ``PUT`` that replaces the kept
        file meanwhile lands beside it, unchecked, and stays there."""
        verified = confined(entry.verified, rel)
        if os.path.isfile(verified):
            return verified
        kept = confined(entry.kept, rel)
        if not is_trusted(info) or not os.path.isfile(kept) or os.path.islink(kept):
            return None
        os.makedirs(os.path.dirname(verified), exist_ok=True)
        checking = f"{verified}.check-{uuid.uuid4().hex[:8]}"
        try:
            os.replace(kept, checking)
        except FileNotFoundError:  # another rank of the node took it
            return verified if os.path.isfile(verified) else None
        try:
            if not file_matches(checking, info):
                logger.warning("The node's copy of %s does not match its manifest; "
                               "fetching it again.", rel)
                return None
            os.replace(checking, verified)
            return verified
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(checking)

    def from_peers(self, entry: TierEntry, rel: str, info: dict[str, Any]) -> str | None:
        """A verified copy of ``rel`` fetched from a peer node into the entry; None without
        peers, or when none has a copy that matches ``info``."""
        if self.peers is None:
            return None
        from elastic_train.storage import peer_replicas  # it builds on this module

        return peer_replicas.fetch(self.peers, entry, rel, info)

    def obtain(self, fs: fsspec.AbstractFileSystem, path: str, entry: TierEntry, rel: str,
               info: dict[str, Any]) -> str | None:
        """A verified copy of ``rel`` in the entry: the node's own, else a peer's, else
        downloaded from the store; None when none matches ``info``."""
        return (self.local_file(entry, rel, info) or self.from_peers(entry, rel, info)
                or self.download(fs, path, entry, rel, info))

    def download(self, fs: fsspec.AbstractFileSystem, path: str, entry: TierEntry, rel: str,
                 info: dict[str, Any] | None) -> str | None:
        """Fetches ``rel`` of checkpoint ``path`` into the entry; None (nothing kept) when
        it does not match ``info``. Transient errors are retried."""
        target = confined(entry.verified, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        partial = f"{target}.part-{uuid.uuid4().hex[:8]}"

        def fetch() -> bool:
            with open(partial, "wb") as out:
                return copy_checked(fs, fsutil.join(path, rel), out, info)

        try:
            good = self._retry(fs).call(f"downloading {rel}", fsutil.display_path(fs, path),
                                        fetch)
            if good:
                os.replace(partial, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(partial)
        return target if good else None

    @contextlib.contextmanager
    def local_copy(self, fs: fsspec.AbstractFileSystem, path: str,
                   manifest: CommitManifest | None) -> Iterator[str]:
        """The whole checkpoint as a local directory, for the block: what the node
        holds and has verified, plus what it downloads now. Without a manifest (not
        a checkpoint committed by elastic-train) every file is downloaded unchecked."""
        entry = self.entry(fs, path, None if manifest is None else manifest.index)
        while True:
            with entry.locked(fcntl.LOCK_SH) as lock:
                # The exclusive lock is asked for only while the entry is incomplete, and
                # held only to fill it: ranks in the block below may be in a collective,
                # waiting for a rank that waits for this lock. (flock's change of mode
                # is no atomic upgrade: a prune may remove the entry in between.)
                if not os.path.exists(entry.complete):
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    if not _is_current(lock, entry.lockfile):
                        continue
                    if not os.path.exists(entry.complete):
                        self._fill(fs, path, entry, manifest)
                        open(entry.complete, "w").close()
                    fcntl.flock(lock, fcntl.LOCK_SH)
                yield entry.verified
                return

    def _fill(self, fs: fsspec.AbstractFileSystem, path: str, entry: TierEntry,
              manifest: CommitManifest | None) -> None:
        files = manifest.files if manifest is not None else {}
        bad = [rel for rel, info in files.items()
               if self.obtain(fs, path, entry, rel, info) is None]
        if bad:
            raise StorageError(f"{fsutil.display_path(fs, path)}: files not matching the "
                               f"checkpoint's manifest: {', '.join(bad[:5])}")
        source = path.rstrip("/")
        found = self._retry(fs).call("listing a checkpoint", fsutil.display_path(fs, path),
                                     lambda: fs.find(source))
        for remote in found:  # files written after the commit (metadata), or no manifest
            rel = remote[len(source):].lstrip("/")
            if rel == MARKER or rel in files:
                continue
            try:
                local = confined(entry.verified, rel)
            except CorruptManifestError as exc:
                logger.warning("Not fetching %s of %s: %s", rel, fsutil.display_path(fs, path),
                               exc)
                continue
            if not os.path.isfile(local):
                self.download(fs, path, entry, rel, None)

