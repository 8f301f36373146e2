"""Rank 0's part of every ``report()``: the one place that decides what the run keeps.

Each rank uploads its own files (:mod:`elastic_train.storage.uploader`); everything
that follows is rank 0's, and lives here:

1. the score check: a checkpoint whose metrics lack
   ``CheckpointConfig.checkpoint_score_attribute`` fails its ``report()`` before
   anything is uploaded;
2. the manifest: the checkpoint's row and every rank's resume state (its file list
   is filled in at the commit);
3. the metrics row, appended to ``metrics.jsonl`` at every report;
4. the commit, run on rank 0's upload thread once its own files are up: it waits
   for the upload markers of every rank that owns files (as long as their uploads
   make progress, :mod:`elastic_train.storage.upload_progress`), merges their file
   descriptions into the manifest and writes the commit marker
   (:meth:`~elastic_train.storage.CheckpointStore.commit`);
5. top-k retention (:mod:`elastic_train.storage.retention`) over the committed
   checkpoints it keeps a record of.

Example::

    committer = Committer(run, CheckpointConfig(num_to_keep=2))
    committer.check_score(metrics, index)
    manifest = committer.manifest(index, row, worker_states)
    ...  # the owners upload and mark their files of checkpoint ``index``
    committer.commit(manifest, owner_ranks=[0, 1])  # on rank 0's upload thread
    committer.record_row(row)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from elastic_train.errors import StorageError
from elastic_train.storage.checkpoint_store import dir_name
from elastic_train.storage.manifest import CommitManifest
from elastic_train.storage.retention import CheckpointRecord, score_of, to_delete

if TYPE_CHECKING:
    from elastic_train.config import CheckpointConfig
    from elastic_train.storage import RunStorage

logger = logging.getLogger(__name__)


class Committer:
    """Rank 0's score check, manifest, metrics row, commit and retention for one attempt.

    ``history`` are the metric rows the attempt goes on from (rewritten whole on stores
    without append); ``committed`` the checkpoints already committed (oldest first),
    which retention weighs with the new ones.
    """

    def __init__(self, storage: RunStorage, config: CheckpointConfig,
                 history: Sequence[dict[str, Any]] = (),
                 committed: Sequence[CheckpointRecord] = ()):
        self.storage = storage
        self.store = storage.checkpoints
        self.config = config
        self._history = list(history)
        self._committed = list(committed)
        self._cancelled = threading.Event()

    @property
    def committed(self) -> list[CheckpointRecord]:
        """The committed checkpoints retention has not deleted, oldest first."""
        return list(self._committed)

    def check_score(self, metrics: dict[str, Any], index: int) -> None:
        """Fails the ``report()`` of checkpoint ``index`` whose metrics lack the score
        attribute (or hold no number there), before anything is uploaded."""
        if self.config.checkpoint_score_attribute:
            score_of(CheckpointRecord(index, metrics), self.config)

    @staticmethod
    def manifest(index: int, row: dict[str, Any],
                 worker_states: Sequence[dict[str, Any]]) -> CommitManifest:
        """The manifest of checkpoint ``index`` reported with ``row``; ``worker_states``
        holds every rank's resume state, by rank. Its files are filled in at the commit,
        from the owners' upload markers."""
        return CommitManifest(index=index, training_iteration=row["training_iteration"],
                              metrics=row, files={}, world_size=len(worker_states),
                              worker_states={str(r): s for r, s in enumerate(worker_states)})

    def record_row(self, row: dict[str, Any]) -> None:
        """Appends the report's row to ``metrics.jsonl``."""
        self._history.append(row)
        self.storage.append_metrics(row, self._history)

    def commit(self, manifest: CommitManifest, owner_ranks: Sequence[int]) -> None:
        """Makes ``manifest``'s checkpoint visible once ``owner_ranks`` uploaded their
        files, then applies retention. Raises StorageError when the owners' uploads make
        no progress for the store's retry budget."""
        self._wait_for_owners(manifest.index, owner_ranks)
        manifest.files = self.store.uploaded_files(manifest.index, list(owner_ranks))
        self.store.commit(manifest)
        self.store.clear_upload_marks(manifest.index)
        self._committed.append(CheckpointRecord(manifest.index, manifest.metrics))
        self._apply_retention()

    def cancel(self) -> None:
        """Stops a commit waiting for other ranks' uploads (the attempt is over)."""
        self._cancelled.set()

    def _wait_for_owners(self, index: int, owner_ranks: Sequence[int]) -> None:
        """Waits for the owners' upload markers as long as their uploads advance: each
        time the retry budget passes, their progress (see
        :mod:`elastic_train.storage.upload_progress`) must have grown since the last look."""
        budget = self.store.retry.budget_s
        deadline = time.monotonic() + budget
        progress: dict[int, int] = {}
        delay = 0.01
        while missing := set(owner_ranks) - self.store.uploaded_ranks(index):
            if time.monotonic() > deadline:
                now = self.store.upload_progress(index, sorted(missing))
                if not any(now[r] > progress.get(r, 0) for r in missing):
                    raise StorageError(
                        f"ranks {sorted(missing)} made no progress uploading "
                        f"{dir_name(index)} to {self.store.display_path} for {budget:.0f}s")
                progress, deadline = now, time.monotonic() + budget
            if self._cancelled.wait(delay):
                raise StorageError(f"the commit of {dir_name(index)} was cancelled: the "
                                   "attempt ended before every rank uploaded its files")
            delay = min(delay * 2, 0.5)

    def _apply_retention(self) -> None:
        for index in to_delete(self._committed, self.config):
            try:
                self.store.delete(index)
            except Exception:
                logger.warning("Could not delete %s; retention will retry at the next "
                               "checkpoint.", dir_name(index), exc_info=True)
                continue
            self._committed = [r for r in self._committed if r.index != index]
