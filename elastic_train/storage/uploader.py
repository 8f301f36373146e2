"""Background checkpoint uploads and the commit that follows them.

``report()`` hands each rank's share of a checkpoint to its
:class:`CheckpointUploader`: the files are copied into a local staging area
(so the user's directory can go away) and queued. A background thread uploads
them (telling rank 0 how far it got, see :mod:`.upload_progress`), then writes
this rank's *done* marker under ``<run>/.upload-marks/``, and on a remote store
moves the staged copy into the node's local tier (:mod:`.local_tier`) for a
restart on this node. Files still being written when ``report()`` is called
(``Checkpoint.from_directory(d, written=future)``, e.g. ``dcp.async_save``) are
not staged then: the upload thread waits for the future and takes the
directory over. On rank 0 a job carries the checkpoint's manifest, and once
rank 0's own files are up the thread hands it to ``commit``: rank 0's committer
(:mod:`elastic_train.worker.committer`) owns what follows -- the wait for the
other owners' done markers, the commit marker and retention; running it on this
thread keeps it off the training's. The queue is bounded: when uploads fall
behind, ``report()`` waits instead of filling the disk.

Coordination goes through storage, not collectives, so the background thread
never touches the process group the training uses.
"""

from __future__ import annotations

import glob
import logging
import math
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from elastic_train.errors import ConfigError, StorageError
from elastic_train.storage import background_priority, peer_replicas
from elastic_train.storage.checkpoint_names import dir_name
from elastic_train.storage.checkpoint_store import (
    CheckpointStore,
    describe_files,
    list_directory,
)
from elastic_train.storage.local_tier import LocalTier
from elastic_train.storage.manifest import CommitManifest
from elastic_train.storage.upload_progress import (
    ProgressReporter,
    UploadCancelled,
    report_interval_s,
)

logger = logging.getLogger(__name__)

# A rank's file list in report() while its files are still being written (see
# Checkpoint.from_directory(written=...)): it uploads whatever it has written by then.
WRITTEN_LATER = "<written in the background>"
# A rank's file list in report() for a NO_UPLOAD checkpoint (rank 0's), or one its
# checkpoint_upload_fn wrote: the files are in the run directory already, and the
# commit describes them there.
IN_PLACE = "<in the run directory>"
BY_UPLOAD_FN = "<written by checkpoint_upload_fn>"


def listed_files(directory: str, written: Future | None) -> list[str] | str:
    """A rank's file list in ``report()``: the files below ``directory``, or
    :data:`WRITTEN_LATER` while a background writer (``written``) is still at work."""
    return WRITTEN_LATER if written is not None else list_directory(directory)


@dataclass
class UploadJob:
    """One rank's part of checkpoint ``index``; ``manifest`` is set on the committing rank
    (its ``files`` are filled in from the owners' upload markers before the commit).
    ``relpaths`` is None while the rank's files are still being written (``written``)."""

    index: int
    relpaths: list[str] | None
    owner_ranks: list[int]
    manifest: CommitManifest | None = None
    staged_dir: str | None = None
    source_dir: str | None = None
    written: Future | None = None
    in_place: bool = False  # files already in the run directory: nothing to upload
    # In place: what puts the files there first, on the upload thread (the rank's
    # checkpoint_upload_fn, see elastic_train.worker.upload_fn).
    write: Callable[[], None] | None = None

    @classmethod
    def plan(cls, index: int, file_lists: Sequence[Sequence[str] | str | None], rank: int,
             manifest: CommitManifest | None = None) -> UploadJob:
        """``rank``'s job, given every rank's file list (None: no checkpoint): each file
        goes up from the lowest rank that has it, so a file all ranks hold goes up once.
        A rank whose list is :data:`WRITTEN_LATER` uploads all of its files, listed once
        written (its job's ``relpaths`` is None until then). Files already in the run
        directory (:data:`IN_PLACE`, :data:`BY_UPLOAD_FN`) go up from nowhere: the
        ranks that put them there only say they are done."""
        if kinds := {f for f in file_lists if f in (IN_PLACE, BY_UPLOAD_FN)}:
            _check_in_place(file_lists, kinds)
            return cls(index=index, relpaths=[], manifest=manifest, in_place=True,
                       owner_ranks=[r for r, f in enumerate(file_lists) if f is not None])
        owners: dict[str, int] = {}
        later = {r for r, files in enumerate(file_lists) if files == WRITTEN_LATER}
        for owner, files in enumerate(file_lists):
            if owner not in later:
                for rel in files or ():
                    owners.setdefault(rel, owner)
        mine = None if rank in later else [rel for rel, r in owners.items() if r == rank]
        return cls(index=index, relpaths=mine,
                   owner_ranks=sorted(set(owners.values()) | later), manifest=manifest)


def _check_in_place(file_lists: Sequence[Sequence[str] | str | None], kinds: set) -> None:
    """A ConfigError unless the ranks' checkpoints are all in the run directory the same
    way."""
    if len(kinds) > 1 or any(f is not None and f not in kinds for f in file_lists):
        raise ConfigError(
            "report(): with checkpoint_upload_mode=NO_UPLOAD the ranks that report a "
            "checkpoint report the run's directory (the others None), and with "
            "checkpoint_upload_fn every rank that reports a checkpoint passes it; no rank "
            "may then report files to upload the default way.")


def _rank_suffix(rank: int) -> str:
    """How a staged checkpoint directory names the rank that staged it."""
    return f".r{rank}"


def discard_staged(staging_root: str, rank: int) -> None:
    """Removes what ``rank`` staged under ``staging_root`` (see
    :meth:`CheckpointUploader._staging_dir`): the uploads of a rank that died, which
    nobody finishes -- its replacement starts with a new uploader."""
    for path in glob.glob(os.path.join(glob.escape(staging_root), "*" + _rank_suffix(rank))):
        shutil.rmtree(path, ignore_errors=True)


def _discard(job: UploadJob) -> None:
    """Removes a finished or dropped job's files: its staged copy, or the directory it
    was handed that was never taken over (once its writer is done with it)."""
    if job.staged_dir:
        shutil.rmtree(job.staged_dir, ignore_errors=True)
    elif job.source_dir and job.written is not None:
        source = job.source_dir
        job.written.add_done_callback(lambda _: shutil.rmtree(source, ignore_errors=True))


class CheckpointUploader:
    """Uploads this rank's checkpoint files in the background; on rank 0, then runs the
    commit.

    ``commit(manifest, owner_ranks)`` (rank 0's committer; None on the other ranks,
    whose jobs carry no manifest) runs on the upload thread for a job with a
    manifest, after this rank's own files are up; ``max_pending`` jobs wait in the
    queue besides the one uploading.
    """

    def __init__(self, store: CheckpointStore, rank: int, staging_root: str,
                 commit: Callable[[CommitManifest, list[int], bool], None] | None = None,
                 max_pending: int = 1, tier: LocalTier | None = None):
        self.store = store
        self.rank = rank
        self.staging_root = staging_root
        self.commit = commit
        # Remote stores only: a local run directory is its own local copy.
        self.tier = None if store.adapter.is_local else tier or LocalTier.for_uploads()
        self._queue: queue.Queue[UploadJob | None] = queue.Queue(maxsize=max_pending)
        self._done: dict[int, str | None] = {}
        self._queued = 0  # jobs submitted and not done yet
        self._cond = threading.Condition()
        self._error: str | None = None
        self._error_type: type[Exception] = StorageError
        self._abandoned = threading.Event()
        self._thread = threading.Thread(target=self._run, name="checkpoint-uploader",
                                        daemon=True)
        self._thread.start()

    def submit(self, job: UploadJob, source_dir: str | None,
               written: Future | None = None) -> None:
        """Stages the job's files from ``source_dir`` and queues it (blocks when full).

        Files still being written (``written`` not done, ``job.relpaths`` None) are
        not waited for: the upload thread takes ``source_dir`` over once they are.
        """
        self.raise_if_failed()
        if job.relpaths is None:
            job.source_dir, job.written = source_dir, written
        elif job.relpaths:
            job.staged_dir = self._staging_dir(job.index)
            for rel in job.relpaths:
                target = os.path.join(job.staged_dir, rel)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copyfile(os.path.join(source_dir, rel), target)
        with self._cond:
            self._queued += 1
        self._queue.put(job)

    def in_flight(self) -> bool:
        """Whether a submitted job is not done yet (queued, uploading or committing)."""
        with self._cond:
            return self._queued > 0

    def wait_for(self, index: int) -> str | None:
        """Waits until job ``index`` is done here; returns its error, if any."""
        with self._cond:
            self._cond.wait_for(lambda: index in self._done)
            return self._done[index]

    def raise_if_failed(self) -> None:
        if self._error:
            raise self._error_type(self._error)

    def close(self) -> None:
        """Waits for every queued job, stops the thread, raises the first upload error."""
        self.finish(math.inf)

    def finish(self, timeout_s: float) -> bool:
        """Waits up to ``timeout_s`` for every queued job; returns whether they are all
        done (then the thread has stopped), and raises the first upload error. When
        they are not, :meth:`abandon` drops the rest."""
        timeout = None if math.isinf(timeout_s) else timeout_s
        deadline = time.monotonic() + (timeout or 0.0)
        try:
            self._queue.put(None, timeout=timeout)  # behind the jobs queued
        except queue.Full:
            return False
        self._thread.join(None if timeout is None else max(deadline - time.monotonic(), 0.0))
        if self._thread.is_alive():
            return False
        self.raise_if_failed()
        return True

    def abandon(self) -> None:
        """Drops every job not committed yet and stops the thread (an in-process restart:
        as if the process had died). Returns once the thread is gone: an upload in
        flight stops at its next part or batch, a retry before its next attempt. What
        was uploaded stays uncommitted, and the next attempt's rank 0 removes it."""
        self._abandoned.set()
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                _discard(job)
                with self._cond:
                    self._queued -= 1
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        background_priority.yield_cpu()
        while (job := self._queue.get()) is not None:
            error, kind = None, StorageError
            try:
                if not self._abandoned.is_set():
                    files = self._process(job)
                    self._keep(job, files)
            except UploadCancelled:
                pass  # abandoned: what went up stays uncommitted
            except Exception as exc:  # surfaced by the next report() or close()
                error = f"checkpoint {dir_name(job.index)} (rank {self.rank}): {exc}"
                kind = ConfigError if isinstance(exc, ConfigError) else StorageError
                logger.error("Upload failed: %s", error)
            finally:
                _discard(job)
            with self._cond:
                self._done[job.index] = error
                self._queued -= 1
                if error and not self._error:
                    self._error, self._error_type = error, kind
                self._cond.notify_all()

    def _staging_dir(self, index: int) -> str:
        return os.path.join(self.staging_root, dir_name(index) + _rank_suffix(self.rank))

    def _take_over(self, job: UploadJob) -> None:
        """Waits for the background writer (raising its error), then moves its
        directory into the staging area."""
        job.written.result()
        job.staged_dir = self._staging_dir(job.index)
        shutil.move(job.source_dir, job.staged_dir)  # a rename on the same file system
        job.relpaths = list_directory(job.staged_dir)

    def _process(self, job: UploadJob) -> dict[str, dict[str, Any]]:
        """Uploads the job's files (then commits, on rank 0); returns what they are
        (size, CRC-32, rank: the manifest's entries)."""
        if job.in_place and self.rank in job.owner_ranks:  # the commit reads the files
            if job.write is not None:
                job.write()
            self.store.uploads.mark_uploaded(job.index, self.rank, {})
        if job.relpaths is None:
            self._take_over(job)
        files: dict[str, dict[str, Any]] = {}
        if job.relpaths:
            # Checksums of the staged copy: exactly the bytes uploaded, and computed
            # here rather than in report(), which then only copies.
            files = {rel: {**info, "rank": self.rank}
                     for rel, info in describe_files(job.staged_dir, job.relpaths).items()}
            interval = report_interval_s(self.store.retry.budget_s)
            with ProgressReporter(self.store.uploads, job.index, self.rank, interval,
                                  cancelled=self._abandoned) as progress:
                self.store.upload(job.index, job.staged_dir, job.relpaths,
                                  callback=progress.callback, cancelled=self._abandoned)
            self.store.uploads.mark_uploaded(job.index, self.rank, files)
        if job.manifest is not None and not self._abandoned.is_set():
            self.commit(job.manifest, job.owner_ranks, job.in_place)
        return files

    def _keep(self, job: UploadJob, files: dict[str, dict[str, Any]]) -> None:
        """Moves the uploaded files into the node's local tier, for a restart on this
        node, sends them to the node's peers (:mod:`.peer_replicas`), and drops what the
        tier holds of checkpoints now superseded."""
        if self.tier is None:
            return
        store = self.store
        try:
            if job.relpaths:
                self.tier.keep(store.fs, store.path(job.index), job.staged_dir, job.relpaths,
                               job.index)
                if self.tier.peers is not None:
                    peer_replicas.send(self.tier.peers, self.tier.entry(
                        store.fs, store.path(job.index), job.index), files, self._abandoned)
            committed = job.index if job.manifest is not None else None
            self.tier.supersede(store.fs, store.run_path, lambda index: index == committed
                                or store.is_committed(store.name(index)))
        except Exception:  # the checkpoint is stored; only this node's copy is missing
            logger.warning("Could not keep checkpoint %s in the node's local tier",
                           dir_name(job.index), exc_info=True)
