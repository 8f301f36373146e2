"""A run's committed checkpoints as one worker knows them: numbering, commit, retention.

Every rank numbers the checkpoints it reports with :meth:`CheckpointManager.reserve_index`
(the ranks reserve in step, as ``report()`` is collective), starting past every
index the run ever used. Rank 0 also commits: once each rank that owns files
of a checkpoint has announced its upload (its marker under ``.upload-marks/``,
see :mod:`.checkpoint_store`; it waits as long as their uploads make progress,
:mod:`.upload_progress`), it merges their file descriptions into the
manifest, writes the commit marker, and applies top-k retention
(:mod:`.retention`) to the committed checkpoints it keeps a record of.

Example::

    manager = CheckpointManager(run.checkpoints, CheckpointConfig(num_to_keep=2))
    index = manager.reserve_index()
    ...  # the owners upload and mark their files of checkpoint ``index``
    manager.commit(manifest, owner_ranks=[0, 1])  # rank 0, on its upload thread
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from elastic_train.errors import StorageError
from elastic_train.storage.checkpoint_store import CheckpointStore, dir_name
from elastic_train.storage.manifest import CommitManifest
from elastic_train.storage.retention import CheckpointRecord, score_of, to_delete

if TYPE_CHECKING:
    from elastic_train.config import CheckpointConfig

logger = logging.getLogger(__name__)


class CheckpointManager:
    """Numbers, commits and retains one run's checkpoints (commits on rank 0 only).

    ``committed`` are the checkpoints already committed (oldest first), which
    retention weighs with the new ones; ``next_index`` the first free index.
    """

    def __init__(self, store: CheckpointStore, config: CheckpointConfig,
                 committed: Sequence[CheckpointRecord] = (), next_index: int = 0):
        self.store = store
        self.config = config
        self._committed = list(committed)
        self._next_index = next_index
        self._cancelled = threading.Event()

    @property
    def committed(self) -> list[CheckpointRecord]:
        """The committed checkpoints retention has not deleted, oldest first."""
        return list(self._committed)

    @property
    def next_index(self) -> int:
        return self._next_index

    def reserve_index(self) -> int:
        """The index of the checkpoint being reported; the next one gets the next."""
        index = self._next_index
        self._next_index += 1
        return index

    def check_score(self, metrics: dict[str, Any]) -> None:
        """Fails the ``report()`` of a checkpoint whose metrics lack the score attribute
        (or hold no number there), before anything is uploaded."""
        if self.config.checkpoint_score_attribute:
            score_of(CheckpointRecord(self._next_index, metrics), self.config)

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
        time the retry budget passes, their progress (see :mod:`.upload_progress`) must
        have grown since the last look."""
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
