"""Rank 0's part of every ``report()``: the one place that decides what the run keeps.

Each rank uploads its own files (:mod:`elastic_train.storage.uploader`); everything
that follows is rank 0's, and lives here:

1. the score check: a checkpoint whose metrics lack
   ``CheckpointConfig.checkpoint_score_attribute`` fails its ``report()`` before
   anything is uploaded;
2. the checkpoint's directory name, when the report chose one: claimed before any
   rank uploads, refused when the run has that name already;
3. the manifest: the checkpoint's row and every rank's resume state (its file list
   is filled in at the commit);
4. the metrics row, appended to ``metrics.jsonl`` at every report;
5. the commit, run on rank 0's upload thread once its own files are up: it waits
   for the upload markers of every rank that owns files (as long as their uploads
   make progress, :mod:`elastic_train.storage.upload_progress`), merges their file
   descriptions into the manifest and writes the commit marker
   (:meth:`~elastic_train.storage.CheckpointStore.commit`);
6. top-k retention (:mod:`elastic_train.storage.retention`) over the committed
   checkpoints it keeps a record of;
7. asynchronous validation's outcome (:mod:`.validation_runner` runs it): a committed
   checkpoint reported with ``validation=`` is handed to the runner, kept by retention
   while pending, and once validated its metrics are merged into its ``metrics.jsonl``
   row, then its manifest (same-named keys overwritten, as Ray's), before retention
   ranks again -- so a validation metric can be the score attribute.

Example::

    committer = Committer(run, CheckpointConfig(num_to_keep=2))
    committer.check_score(metrics, index)
    manifest = committer.manifest(index, row, worker_states)
    ...  # the owners upload and mark their files of checkpoint ``index``
    committer.commit(manifest, owner_ranks=[0, 1])  # on rank 0's upload thread
    committer.record_row(row)
    committer.finish_validation(manifest, Outcome("VALIDATED", {"val_loss": 0.1}))
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from elastic_train.errors import StorageError
from elastic_train.storage.checkpoint_names import dir_name
from elastic_train.storage.manifest import CommitManifest
from elastic_train.storage.retention import CheckpointRecord, score_of, to_delete

if TYPE_CHECKING:
    from elastic_train.config import CheckpointConfig
    from elastic_train.storage import RunStorage
    from elastic_train.worker.validation_runner import Outcome, ValidationRunner

logger = logging.getLogger(__name__)


class Committer:
    """Rank 0's score check, manifest, metrics row, commit and retention for one attempt.

    ``history`` are the metric rows the attempt goes on from (rewritten whole on stores
    without append); ``committed`` the checkpoints already committed (oldest first),
    which retention weighs with the new ones. ``validations`` runs the validations
    (set by the session when the trainer has a ``validation_config``). The training
    thread (rows), the upload thread (commits) and the validation thread (outcomes)
    all change the rows and the records: one lock orders them.
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
        self._lock = threading.Lock()
        self._pending: set[int] = set()  # committed, waiting for their validation
        self.validations: ValidationRunner | None = None

    @property
    def committed(self) -> list[CheckpointRecord]:
        """The committed checkpoints retention has not deleted, oldest first."""
        return list(self._committed)

    def check_score(self, metrics: dict[str, Any], index: int, validating: bool = False
                    ) -> None:
        """Fails the ``report()`` of checkpoint ``index`` whose metrics lack the score
        attribute (or hold no number there), before anything is uploaded -- unless the
        checkpoint is ``validating``: its validation may bring the attribute (without it,
        it ranks last, as Ray ranks a missing score)."""
        if self.config.checkpoint_score_attribute and not validating:
            score_of(CheckpointRecord(index, metrics), self.config)

    def claim(self, index: int, name: str, in_place: bool = False) -> None:
        """Reserves the directory name ``name`` for checkpoint ``index`` before any rank
        uploads (see :mod:`elastic_train.storage.checkpoint_names`); a ConfigError when
        the run has an entry of that name already (or none, ``in_place``: NO_UPLOAD)."""
        self.store.names.claim(index, name, in_place)

    @staticmethod
    def manifest(index: int, row: dict[str, Any],
                 worker_states: Sequence[dict[str, Any]],
                 validation_task: dict[str, Any] | None = None) -> CommitManifest:
        """The manifest of checkpoint ``index`` reported with ``row`` (whose
        ``checkpoint_dir_name`` is its directory); ``worker_states`` holds every rank's
        resume state, by rank; ``validation_task`` the validation asked for
        (``{"fn_kwargs", "timeout_s"}``), if any. Its files are filled in at the commit,
        from the owners' upload markers. Its metrics are ``row`` itself, so a validation
        that ends before the row is recorded is in the row too."""
        name = row.get("checkpoint_dir_name", dir_name(index))
        validation = ({"status": "PENDING_VALIDATION", "task": validation_task}
                      if validation_task is not None else {})
        return CommitManifest(index=index, training_iteration=row["training_iteration"],
                              metrics=row, files={}, world_size=len(worker_states),
                              worker_states={str(r): s for r, s in enumerate(worker_states)},
                              checkpoint_dir_name="" if name == dir_name(index) else name,
                              validation=validation)

    def record_row(self, row: dict[str, Any]) -> None:
        """Appends the report's row to ``metrics.jsonl``."""
        with self._lock:
            self._history.append(row)
            self.storage.append_metrics(row, self._history)

    def commit(self, manifest: CommitManifest, owner_ranks: Sequence[int],
               in_place: bool = False) -> None:
        """Makes ``manifest``'s checkpoint visible once ``owner_ranks`` uploaded their
        files, then applies retention. Raises StorageError when the owners' uploads make
        no progress for the store's retry budget. Files ``in_place`` (NO_UPLOAD,
        checkpoint_upload_fn) are read from the run directory for their descriptions."""
        self._wait_for_owners(manifest.index, owner_ranks)
        manifest.files = (self.store.describe_in_place(manifest.index) if in_place else
                          self.store.uploads.uploaded_files(manifest.index, list(owner_ranks)))
        with self._lock:
            self.store.commit(manifest)
            self.store.uploads.clear(manifest.index)
            self._committed.append(CheckpointRecord(manifest.index, manifest.metrics))
            if manifest.validation_pending and self.validations is not None:
                self._pending.add(manifest.index)
                self.validations.submit(manifest)
            self._apply_retention()

    def requeue_validations(self) -> None:
        """Hands the validations an earlier attempt left pending to :attr:`validations`
        (at the start of an attempt; one listing of the run directory)."""
        pending = [m for m in self.store.committed() if m.validation_pending]
        with self._lock:
            self._pending.update(m.index for m in pending)
        if self.validations is not None:
            self.validations.requeue(pending)

    def finish_validation(self, manifest: CommitManifest, outcome: Outcome) -> None:
        """Records how checkpoint ``manifest``'s validation ended: when VALIDATED, its
        metrics merged into the checkpoint's row, which ``metrics.jsonl`` is rewritten
        with (same-named keys overwritten, as Ray's), and into the manifest; then its
        status (and, when it failed, why) in the manifest's marker; then retention ranks
        again. The rows go first: a crash before the marker leaves the checkpoint
        ``PENDING_VALIDATION``, validated again by the next attempt (which writes the
        same metrics over the same keys), never ended without its metrics in the rows."""
        with self._lock:
            rows = [r for r in self._history
                    if r.get("checkpoint_dir_name") == manifest.name]
            for row in rows:
                row.update(outcome.metrics)
            if rows and outcome.metrics:
                self.storage.write_metrics(self._history)
            manifest.validation = {**manifest.validation, "status": outcome.status,
                                   **({"error": outcome.error} if outcome.error else {})}
            manifest.metrics.update(outcome.metrics)
            self.store.commit(manifest)  # the marker again, now with the outcome
            self._committed = [CheckpointRecord(r.index, manifest.metrics)
                               if r.index == manifest.index else r for r in self._committed]
            self._pending.discard(manifest.index)
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
        while missing := set(owner_ranks) - self.store.uploads.uploaded_ranks(index):
            if time.monotonic() > deadline:
                now = self.store.uploads.upload_progress(index, sorted(missing))
                if not any(now[r] > progress.get(r, 0) for r in missing):
                    raise StorageError(
                        f"ranks {sorted(missing)} made no progress uploading "
                        f"{self.store.name(index)} to {self.store.display_path} for {budget:.0f}s")
                progress, deadline = now, time.monotonic() + budget
            if self._cancelled.wait(delay):
                raise StorageError(f"the commit of {self.store.name(index)} was cancelled: the "
                                   "attempt ended before every rank uploaded its files")
            delay = min(delay * 2, 0.5)

    def _apply_retention(self) -> None:
        for index in to_delete(self._committed, self.config, self._pending):
            try:
                self.store.delete(index)
            except Exception:
                logger.warning("Could not delete %s; retention will retry at the next "
                               "checkpoint.", self.store.name(index), exc_info=True)
                continue
            self._committed = [r for r in self._committed if r.index != index]
