"""Checkpoints in the run directory, committed atomically.

A checkpoint is the directory ``checkpoint_NNNNNN/`` (or the name the report
chose, claimed first: see :mod:`.checkpoint_names`, whose :class:`NameClaims` the
store holds as :attr:`CheckpointStore.names`) holding the files of
every rank that reported one, plus the commit marker ``.commit.json``
(:class:`CommitManifest`: index, metrics, file list with sizes and CRC-32s,
per-rank resume state) written last. A directory without the marker does not
exist for readers and is removed at the next start; deletion removes the
marker first, so a reader never sees half a checkpoint. A checkpoint found damaged
(a corrupt marker, or files that do not match it) is set aside under ``.damaged/``:
its name is free again, its number stays used.

The protocol is the same on every fsspec store: files are written into their
final place (no directory rename, which object stores cannot do atomically)
and the marker is one small atomic write. On local disk the files and their
directories are fsynced before the marker is written, and the marker's rename is
synced too, so a power cut never leaves a marker over files it lost. Ranks
announce a finished upload with a marker under ``.upload-marks/`` (their files'
sizes and CRC-32s, computed off the training thread) that the committing rank
waits for and merges into the manifest (:mod:`.upload_progress`, whose
:class:`UploadMarks` the store holds as :attr:`CheckpointStore.uploads`). Every
operation is retried on transient errors (see :mod:`.retry`).

"No marker" is never taken from one lookup: an NFS client caches "not found" for
up to ``acdirmin`` (30 s), so a node may not see a marker another node wrote
seconds ago. Before a checkpoint is treated as uncommitted -- and above all before
it is deleted as such -- its directory is listed afresh (opening a directory
revalidates it on NFS; on object stores a listing is what the store holds) and the
marker read again if it is there. Writes that could harm another job's checkpoints
(upload, commit, deletion, cleanup) first check the run's lease (``fence``, see
:mod:`.lease`).
"""

from __future__ import annotations

import enum
import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, TypeVar

import fsspec
from fsspec.callbacks import Callback

from elastic_train.errors import CorruptManifestError, StorageError
from elastic_train.storage import filesystem as fsutil
from elastic_train.storage.checkpoint_names import (
    DEFAULT_RE,
    NameClaims,
    claim_file,
    parse_claim,
)
from elastic_train.storage.manifest import CommitManifest
from elastic_train.storage.retry import RetryPolicy
from elastic_train.storage.stores import adapter_for
from elastic_train.storage.upload_progress import UploadMarks, stop_if

if TYPE_CHECKING:
    from elastic_train.storage.lease import LeaseFence

logger = logging.getLogger(__name__)

T = TypeVar("T")

MARKER = ".commit.json"
# Checkpoints found damaged, kept for a person to look at: <NNNNNN>.<name>/ (see set_aside).
DAMAGED_DIR = ".damaged"
# Files per batch sent at once: bounds the memory s3fs uses for concurrent multipart uploads.
UPLOAD_BATCH = 4


class Damaged(enum.Enum):
    """What a checkpoint directory with a corrupt commit marker holds, for readers."""

    DAMAGED = "damaged"


DAMAGED = Damaged.DAMAGED


def list_directory(local_dir: str) -> list[str]:
    """The relative paths (``/``-separated) of every file below ``local_dir``."""
    files = []
    for root, _, names in os.walk(local_dir):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), local_dir).replace(os.sep, "/")
            if rel != MARKER:
                files.append(rel)
    return sorted(files)


def describe_files(local_dir: str, relpaths: list[str]) -> dict[str, dict[str, Any]]:
    """``{relative path: {"size", "crc32", "sha256"}}``: what the manifest records of
    each file (each read once)."""
    return {rel: fsutil.file_digest(os.path.join(local_dir, rel)).info() for rel in relpaths}


def scan_directory(local_dir: str) -> dict[str, dict[str, Any]]:
    """:func:`describe_files` of every file below ``local_dir``."""
    return describe_files(local_dir, list_directory(local_dir))


def file_matches(path: str, info: dict[str, Any]) -> bool:
    """Whether the local file exists with the manifest's size and checksums (``info``;
    see :meth:`.manifest.FileDigest.matches`)."""
    return (os.path.isfile(path) and os.path.getsize(path) == info["size"]
            and fsutil.file_digest(path).matches(info))


def mismatched_files(local_dir: str, manifest: CommitManifest) -> list[str]:
    """Files of a local copy whose size or checksums differ from the manifest."""
    return [rel for rel, info in manifest.files.items()
            if not file_matches(os.path.join(local_dir, rel), info)]


def parse_marker(raw: bytes, path: str) -> CommitManifest:
    """The manifest in the marker ``raw`` of checkpoint directory ``path``;
    :class:`CorruptManifestError` unless it is one, of this directory's index."""
    try:
        manifest = CommitManifest.from_json(json.loads(raw))
    except ValueError as exc:  # not JSON, not UTF-8, or CorruptManifestError
        raise CorruptManifestError(f"{path}/{MARKER}: {exc}") from None
    match = DEFAULT_RE.match(path.rstrip("/").rsplit("/", 1)[-1])
    if match and manifest.name != match.group(0):
        raise CorruptManifestError(f"{path}/{MARKER}: the commit marker of {manifest.name} "
                                   f"(index={manifest.index}) in {match.group(0)}")
    return manifest


class CheckpointStore:
    """Reads, writes, commits and deletes the checkpoints of one run; :attr:`names` holds
    their names and claims, :attr:`uploads` the ranks' upload markers."""

    def __init__(self, fs: fsspec.AbstractFileSystem, run_path: str,
                 retry: RetryPolicy | None = None, fence: LeaseFence | None = None):
        self.fs = fs
        self.run_path = run_path
        self.adapter = adapter_for(fs)
        self.retry = (retry or RetryPolicy()).for_store(self.adapter)
        self.fence = fence
        self.names = NameClaims(self.adapter, run_path, self._retry, self._fenced)
        self.uploads = UploadMarks(self.adapter, run_path, self._retry, self.name)

    @property
    def display_path(self) -> str:
        return fsutil.display_path(self.fs, self.run_path)

    def _retry(self, what: str, fn: Callable[[], T]) -> T:
        return self.retry.call(what, self.display_path, fn)

    def _fenced(self, what: str) -> None:
        if self.fence is not None:
            self.fence.check(what)

    def is_committed(self, name: str) -> bool:
        """Whether the checkpoint directory ``name`` (``checkpoint_000007``) has its marker."""
        directory = fsutil.join(self.run_path, name)
        if self._retry("checking a commit marker",
                       lambda: self.fs.exists(fsutil.join(directory, MARKER))):
            return True
        return MARKER in self._retry("listing a checkpoint directory",
                                     lambda: fsutil.names_in(self.fs, directory))

    def name(self, index: int) -> str:
        """The name of checkpoint ``index``'s directory (see :meth:`NameClaims.name`)."""
        return self.names.name(index)

    def path(self, index: int) -> str:
        return fsutil.join(self.run_path, self.name(index))

    def describe_in_place(self, index: int) -> dict[str, dict[str, Any]]:
        """:func:`describe_files` of the files the user wrote into checkpoint ``index``'s
        directory (NO_UPLOAD), read from the store (each file streamed once)."""
        root = self.path(index)
        files = {}
        for path in self._retry("listing a checkpoint", lambda: self.fs.find(root)):
            rel = path[len(root):].lstrip("/")
            if rel != MARKER:
                digest = self._retry(f"reading {rel}",
                                     lambda p=path: fsutil.stream_digest(self.fs, p))
                files[rel] = {**digest.info(), "rank": 0}
        return files

    def _list(self, path: str) -> list[str]:
        """The names in directory ``path`` (none if it is missing), listed afresh."""
        return sorted(self._retry("listing checkpoints", lambda: fsutil.names_in(self.fs, path)))

    def _checkpoint_dirs(self) -> dict[int, str]:
        dirs = {int(m.group(1)): m.group(0)
                for m in map(DEFAULT_RE.match, self._list(self.run_path)) if m}
        dirs.update(self.names.listed())
        return {index: fsutil.join(self.run_path, name) for index, name in dirs.items()}

    def manifest_of(self, name: str) -> CommitManifest | None:
        """The commit marker of the checkpoint directory ``name``, None while it has none
        (one marker read: for a watcher of new commits, where :meth:`committed` would read
        every checkpoint's)."""
        path = fsutil.join(self.run_path, name)
        raw = self._retry("reading a commit marker", lambda: fsutil.read_unless_missing(
            self.fs, fsutil.join(path, MARKER), lambda p: fsutil.read_bytes(self.fs, p)))
        return None if raw is None else parse_marker(raw, path)

    def _read_manifest(self, index: int, path: str) -> CommitManifest | None:
        """The marker of the checkpoint directory ``path``; None only when a fresh listing
        of the directory confirms there is none. A marker that is no manifest of checkpoint
        ``index`` raises :class:`CorruptManifestError`."""
        raw = self._retry("reading a commit marker", lambda: fsutil.read_unless_missing(
            self.fs, fsutil.join(path, MARKER), lambda p: fsutil.read_bytes(self.fs, p)))
        if raw is None:
            return None
        manifest = parse_marker(raw, path)
        if manifest.index != index:  # a claimed name whose marker is another checkpoint's
            raise CorruptManifestError(f"{path}/{MARKER}: commit marker index="
                                       f"{manifest.index} in the directory of checkpoint {index}")
        return manifest

    def _manifest_or_damaged(self, index: int, path: str) -> CommitManifest | None | Damaged:
        """:meth:`_read_manifest`, with a corrupt marker logged and given as ``DAMAGED``."""
        try:
            return self._read_manifest(index, path)
        except CorruptManifestError as exc:
            logger.warning("Checkpoint %s is damaged and is skipped: %s", self.name(index), exc)
            return DAMAGED

    def committed(self) -> list[CommitManifest]:
        """Every committed checkpoint, oldest first (one with a corrupt marker left out)."""
        manifests = [self._manifest_or_damaged(i, p)
                     for i, p in sorted(self._checkpoint_dirs().items())]
        return [m for m in manifests if isinstance(m, CommitManifest)]

    def remove_uncommitted(self) -> list[int]:
        """Deletes leftovers of interrupted uploads (directories without a marker, and
        unfinished multipart uploads on object stores); returns the directories' indices
        (and those of directories with a corrupt marker, which stay: see :meth:`sweep`)."""
        return self.sweep()[0]

    def sweep(self) -> tuple[list[int], list[CommitManifest]]:
        """:meth:`remove_uncommitted` and :meth:`committed` in one pass over the run
        directory (a start needs both; each marker is read once). The indices returned
        also name the checkpoints set aside as damaged, now (a corrupt marker) or at an
        earlier start: no number is reused."""
        self._fenced("removing unfinished uploads")
        aborted = self._retry("aborting unfinished multipart uploads",
                              lambda: self.adapter.abort_unfinished_uploads(self.run_path))
        if aborted:
            logger.info("Aborted %d unfinished multipart upload(s) under %s", aborted,
                        self.display_path)
        removed, manifests = [], []
        for index, path in sorted(self._checkpoint_dirs().items()):
            manifest = self._manifest_or_damaged(index, path)
            if isinstance(manifest, CommitManifest):
                manifests.append(manifest)
                continue
            if manifest is DAMAGED:
                self._set_aside_if_possible(index)
                removed.append(index)
                continue
            if not self.names.in_place(index):  # the user's own files (NO_UPLOAD) stay
                logger.info("Removing uncommitted checkpoint directory %s", path)
                self._retry("removing an uncommitted checkpoint",
                            lambda p=path: self.adapter.remove_tree(p))
            self.names.unclaim(index)
            removed.append(index)
        self.uploads.clear_all()
        aside = [claim[0] for claim in map(parse_claim, self._list(
            fsutil.join(self.run_path, DAMAGED_DIR))) if claim]
        return sorted({*removed, *aside}), manifests

    def _set_aside_if_possible(self, index: int) -> None:
        """:meth:`set_aside` at a sweep: a damaged checkpoint that cannot be moved (the
        store refuses a name its marker made it write) stays where it is, unread -- a
        start never fails for it; the next start tries again."""
        try:
            self.set_aside(index)
        except (OSError, StorageError) as e:
            logger.warning("Could not set the damaged checkpoint %s aside (%s); it stays "
                           "where it is and is not read.", self.name(index), e)

    def set_aside(self, index: int) -> None:
        """Moves checkpoint ``index``, found damaged, to ``.damaged/<NNNNNN>.<name>/``,
        marker and all, for a person to look at: readers no longer see it, its name is
        free for a later report (its claim goes last), and :meth:`sweep` still counts its
        number as used. One rename where the store has one; elsewhere a copy, then the
        original is deleted marker first -- a move cut short is done again at the next
        start (the original is still damaged), or swept (its marker gone)."""
        name = self.name(index)
        what = f"setting aside the damaged checkpoint {name}"
        self._fenced(what)
        source = self.path(index)
        target = fsutil.join(self.run_path, DAMAGED_DIR, claim_file(index, name))
        logger.warning("Checkpoint %s is damaged: it is moved to %s, and its name is free "
                       "again.", name, fsutil.display_path(self.fs, target))
        self._retry(what, lambda: self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True))
        if self._retry(what, lambda: self.adapter.rename_tree(source, target)):
            self.names.unclaim(index)
            return
        files = self._retry(what, lambda: self.fs.find(source))
        self._retry(what, lambda: self.fs.copy(
            files, [target + f[len(source.rstrip("/")):] for f in files]))
        self.delete(index)

    def upload(self, index: int, local_dir: str, relpaths: list[str],
               callback: Callback | None = None,
               cancelled: threading.Event | None = None) -> None:
        """Copies the named files of ``local_dir`` into checkpoint ``index``.

        On local disk the files are hard-linked where the run directory is on
        the same device (no copy at all), so ``local_dir`` must be a private
        copy nobody writes again -- the uploader's staging area is. ``callback``
        follows the transfers (fsspec's, see :mod:`.upload_progress`); once
        ``cancelled`` is set, no further batch or retry starts (UploadCancelled).
        """
        self._fenced(f"uploading {self.name(index)}")
        target = self.path(index)
        local = [os.path.join(local_dir, rel) for rel in relpaths]
        remote = [fsutil.join(target, rel) for rel in relpaths]
        for directory in sorted({r.rsplit("/", 1)[0] for r in remote}):
            self._retry("creating a checkpoint directory",
                        lambda d=directory: self.fs.makedirs(d, exist_ok=True))
        if not self.adapter.link_files(local, remote):
            self._put(index, local, remote, callback, cancelled)
        # Durable before rank 0 may commit: the marker must never outlive the files.
        self._retry(f"syncing {self.name(index)}",
                    lambda: self.adapter.make_durable(remote, self.run_path))

    def _put(self, index: int, local: list[str], remote: list[str],
             callback: Callback | None, cancelled: threading.Event | None) -> None:
        target = self.path(index)
        options = self.adapter.put_options()
        if callback is not None:
            options["callback"] = callback
        for start in range(0, len(local), UPLOAD_BATCH):
            batch = slice(start, start + UPLOAD_BATCH)
            stop_if(cancelled)
            # A retry first aborts the multipart uploads the failed attempt left open
            # (s3fs cannot abort them while the endpoint is down); other ranks' go on.
            self.retry.call(
                f"uploading {self.name(index)}", self.display_path,
                lambda b=batch: self.fs.put(local[b], remote[b], **options),
                before_retry=lambda b=batch: (stop_if(cancelled),
                                              self.adapter.abort_unfinished_uploads(
                                                  target, only=remote[b])))

    def commit(self, manifest: CommitManifest) -> None:
        """Makes checkpoint ``manifest.index`` visible: the marker is written last."""
        self._fenced(f"committing {manifest.name}")
        marker = fsutil.join(self.path(manifest.index), MARKER)
        self._retry(f"committing {manifest.name}", lambda: fsutil.write_json_atomic(
            self.fs, marker, asdict(manifest)))

    def delete(self, index: int) -> None:
        """Removes a whole checkpoint, marker first so it vanishes for readers at once
        (a custom name's claim last, so that a cut-short deletion is swept at the next
        start)."""
        what = f"deleting {self.name(index)}"
        self._fenced(what)
        path = self.path(index)
        self._retry(what, lambda: self.fs.rm(fsutil.join(path, MARKER)))
        # The marker's removal reaches the disk before the files' (no marker over holes).
        self._retry(what, lambda: self.adapter.make_durable([path], path))
        self._retry(what, lambda: self.adapter.remove_tree(path))
        self.names.unclaim(index)
