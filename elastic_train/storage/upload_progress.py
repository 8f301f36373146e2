"""How far a rank's upload of a checkpoint has got, told to the rank that commits it.

Rank 0 commits a checkpoint once every rank that owns files of it has uploaded
them. It waits as long as those uploads advance, not for a fixed time: a rank
sending a large shard over a slow link may take far longer than
``RunConfig(storage_retry_timeout_s)`` and still be fine, while an upload that
stalls (the store is gone, the rank is stuck) is given up on once it made no
progress for that long.

The uploading rank counts the bytes the store has taken (fsspec's transfer
callbacks: per file, and per part of a multipart upload) and, every interval in
which the count grew, writes it beside its upload marker
(:meth:`~elastic_train.storage.checkpoint_store.CheckpointStore.note_progress`);
rank 0 reads the counts only when its patience runs out.

Example::

    with ProgressReporter(store, index, rank, interval_s=5) as progress:
        store.upload(index, staged_dir, relpaths, callback=progress.callback)
"""

from __future__ import annotations

import logging
import threading
from types import TracebackType
from typing import TYPE_CHECKING, Any

from fsspec.callbacks import Callback

if TYPE_CHECKING:
    from elastic_train.storage.checkpoint_store import CheckpointStore

logger = logging.getLogger(__name__)


def report_interval_s(patience_s: float) -> float:
    """How often an uploading rank tells its progress: often enough that rank 0, which
    waits ``patience_s`` between looks, always sees an upload that advances."""
    return max(0.2, min(5.0, patience_s / 4))


class _Counter:
    def __init__(self) -> None:
        self.value = 0
        self._lock = threading.Lock()

    def add(self, amount: int) -> None:
        with self._lock:
            self.value += amount


class UploadCancelled(Exception):
    """The upload was called off (the uploader was abandoned: an in-process restart)."""


def stop_if(cancelled: threading.Event | None) -> None:
    """Raises UploadCancelled once ``cancelled`` is set."""
    if cancelled is not None and cancelled.is_set():
        raise UploadCancelled("the uploader was abandoned")


class _FileBytes(Callback):
    """One file's transfer: every update is bytes the store took."""

    def __init__(self, owner: ByteCount):
        super().__init__()
        self._owner = owner

    def relative_update(self, inc: int = 1) -> None:
        self._owner.counter.add(inc)
        stop_if(self._owner.cancelled)


class ByteCount(Callback):
    """An fsspec callback for ``put``: counts the bytes of every file it transfers
    (its own updates count files, and are ignored), and stops the transfer at its next
    part, raising UploadCancelled, once ``cancelled`` is set."""

    def __init__(self, cancelled: threading.Event | None = None) -> None:
        super().__init__()
        self.counter = _Counter()
        self.cancelled = cancelled

    def branched(self, path_1: str, path_2: str, **kwargs: Any) -> Callback:
        return _FileBytes(self)


class ProgressReporter:
    """While open, writes the byte count of one rank's upload of checkpoint ``index``
    every ``interval_s`` in which it grew (from a thread of its own, best effort);
    ``cancelled`` calls the transfer off (see :class:`ByteCount`)."""

    def __init__(self, store: CheckpointStore, index: int, rank: int, interval_s: float,
                 cancelled: threading.Event | None = None):
        self.callback = ByteCount(cancelled)
        self._store, self._index, self._rank = store, index, rank
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="upload-progress", daemon=True)

    def __enter__(self) -> ProgressReporter:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()  # not joined: a write blocked on a dead store must not hold us

    def _run(self) -> None:
        told = 0
        while not self._stop.wait(self._interval_s):
            done = self.callback.counter.value
            if done == told:
                continue
            try:
                self._store.note_progress(self._index, self._rank, done)
                told = done
            except Exception as exc:  # noqa: BLE001 -- the upload itself reports real errors
                logger.debug("Could not note upload progress: %r", exc)
