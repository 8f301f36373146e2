"""How far a rank's upload of a checkpoint has got, told to the rank that commits it.

Each rank that uploads files of checkpoint ``index`` announces the end of its upload with
an *upload marker* under ``<run>/.upload-marks/`` (its files' sizes and checksums, which
the committing rank merges into the manifest), and while it uploads, a *progress marker*
beside it (the bytes sent so far). :class:`UploadMarks` writes, reads and removes both.

Rank 0 commits a checkpoint once every rank that owns files of it has uploaded
them. It waits as long as those uploads advance, not for a fixed time: a rank
sending a large shard over a slow link may take far longer than
``RunConfig(storage_retry_timeout_s)`` and still be fine, while an upload that
stalls (the store is gone, the rank is stuck) is given up on once it made no
progress for that long.

The uploading rank counts the bytes the store has taken (fsspec's transfer
callbacks: per file, and per part of a multipart upload) and, every interval in
which the count grew, writes it beside its upload marker
(:meth:`UploadMarks.note_progress`); rank 0 reads the counts only when its patience
runs out.

Example::

    with ProgressReporter(store.uploads, index, rank, interval_s=5) as progress:
        store.upload(index, staged_dir, relpaths, callback=progress.callback)
    store.uploads.mark_uploaded(index, rank, files)
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from fsspec.callbacks import Callback

from elastic_train.errors import StorageError
from elastic_train.storage import filesystem as fsutil
from elastic_train.storage.checkpoint_names import dir_name

if TYPE_CHECKING:
    from elastic_train.storage.retry import Retrying
    from elastic_train.storage.stores.base import StoreAdapter

logger = logging.getLogger(__name__)

# Not ".uploads": SeaweedFS keeps its multipart parts under that name and hides it
# from listings, so markers there would never be seen.
UPLOADS_DIR = ".upload-marks"


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


class UploadMarks:
    """The upload and progress markers of the run at ``run_path``, as the module describes.
    ``retrying`` is the store's call with retries; ``name(index)`` names checkpoint
    ``index`` in errors."""

    def __init__(self, adapter: StoreAdapter, run_path: str, retrying: Retrying,
                 name: Callable[[int], str]) -> None:
        self._adapter, self._retrying, self._name = adapter, retrying, name
        self._dir = fsutil.join(run_path, UPLOADS_DIR)

    def _mark(self, index: int, rank: int | None = None) -> str:
        name = dir_name(index) + (f".rank{rank}" if rank is not None else "")
        return fsutil.join(self._dir, name)

    def _progress_mark(self, index: int, rank: int) -> str:
        return f"{self._mark(index)}.progress.rank{rank}"

    def mark_uploaded(self, index: int, rank: int, files: dict[str, dict[str, Any]]) -> None:
        """Announces that ``rank`` finished uploading its files of checkpoint ``index``;
        the marker holds their sizes and checksums (see
        :func:`~.checkpoint_store.describe_files`)."""
        self._retrying("writing an upload marker", lambda: fsutil.write_json_atomic(
            self._adapter.fs, self._mark(index, rank), files))

    def uploaded_files(self, index: int, ranks: list[int]) -> dict[str, dict[str, Any]]:
        """The file descriptions in the upload markers of ``ranks``, merged; two ranks
        that uploaded the same file (written in the background, so not deduplicated
        in ``report()``) are an error: one would have overwritten the other."""
        files: dict[str, dict[str, Any]] = {}
        for rank in ranks:
            mine = self._retrying("reading an upload marker", lambda r=rank: fsutil.read_json(
                self._adapter.fs, self._mark(index, r)))
            if clash := sorted(set(mine) & set(files)):
                raise StorageError(
                    f"{self._name(index)}: ranks {files[clash[0]].get('rank')} and {rank} both "
                    f"wrote {', '.join(clash[:3])}; files written in the background must "
                    "have names of their own per rank (as DCP's are).")
            files.update(mine)
        return files

    def _marks(self, index: int) -> list[str]:
        """Every entry of checkpoint ``index`` under ``.upload-marks/``, listed afresh."""
        prefix = self._mark(index).rsplit("/", 1)[-1] + "."
        found = self._retrying("listing upload markers",
                               lambda: fsutil.names_in(self._adapter.fs, self._dir))
        return [fsutil.join(self._dir, n) for n in sorted(found) if n.startswith(prefix)]

    def uploaded_ranks(self, index: int) -> set[int]:
        prefix = self._mark(index) + ".rank"
        # Another rank's marker may be mid-write: its temporary name does not count.
        suffixes = (n[len(prefix):] for n in self._marks(index) if n.startswith(prefix))
        return {int(suffix) for suffix in suffixes if suffix.isdigit()}

    def note_progress(self, index: int, rank: int, uploaded_bytes: int) -> None:
        """Tells the committing rank how far ``rank``'s upload of ``index`` has got
        (once, without retries: :class:`ProgressReporter` tells it again)."""
        fsutil.write_json_atomic(self._adapter.fs, self._progress_mark(index, rank),
                                 {"bytes": uploaded_bytes})

    def upload_progress(self, index: int, ranks: list[int]) -> dict[int, int]:
        """The bytes each of ``ranks`` last told it had uploaded of ``index`` (0: none)."""
        def read(rank: int) -> int:
            try:  # one GET: the marker may be rewritten meanwhile (s3fs's open() then fails)
                return int(json.loads(self._adapter.fs.cat_file(
                    self._progress_mark(index, rank)))["bytes"])
            except FileNotFoundError:
                return 0

        return {r: self._retrying("reading upload progress", lambda r=r: read(r))
                for r in ranks}

    def clear(self, index: int) -> None:
        """Removes checkpoint ``index``'s markers (it is committed)."""
        def remove(mark: str) -> None:
            with contextlib.suppress(FileNotFoundError):  # e.g. a temporary name, renamed
                self._adapter.fs.rm(mark)

        for mark in self._marks(index):
            self._retrying("removing an upload marker", lambda m=mark: remove(m))

    def clear_all(self) -> None:
        """Removes every marker of the run (at a start's sweep: no upload is under way)."""
        if self._retrying("listing upload markers", lambda: self._adapter.fs.exists(self._dir)):
            self._retrying("removing upload markers",
                           lambda: self._adapter.remove_tree(self._dir))


class ProgressReporter:
    """While open, writes the byte count of one rank's upload of checkpoint ``index``
    every ``interval_s`` in which it grew (from a thread of its own, best effort) to
    ``marks`` (:meth:`UploadMarks.note_progress`); ``cancelled`` calls the transfer off
    (see :class:`ByteCount`)."""

    def __init__(self, marks: UploadMarks, index: int, rank: int, interval_s: float,
                 cancelled: threading.Event | None = None):
        self.callback = ByteCount(cancelled)
        self._marks, self._index, self._rank = marks, index, rank
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
                self._marks.note_progress(self._index, self._rank, done)
                told = done
            except Exception as exc:  # noqa: BLE001 -- the upload itself reports real errors
                logger.debug("Could not note upload progress: %r", exc)
