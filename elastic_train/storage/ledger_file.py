"""The run's goodput ledger on the store: ``goodput/``, one append-only file per writer.

Each writer (the driver of a launch, rank 0 of an attempt) has a file of its own,
``goodput/<source>-<time_ns>-<pid>.jsonl``, so that no two processes ever append to
the same file: on a store that cannot append (S3), the file is a log of segments
(:mod:`.jsonl_log`), whose last a writer puts again with each line, which is safe only
with one writer. Lines are JSON, one per event; a line a crash cut short is skipped by
the reader, and with it only that event. What the lines mean:
:mod:`elastic_train.goodput.breakdown`.

Writing is bookkeeping: a line that cannot be written (a store that is down, a
directory that is not writable) is kept and tried again with the next one, and the
first failure is logged once; training never waits on a retry or fails for it.
Nothing here calls fsync: a writer writes at boundaries (a checkpoint report, every
few seconds at a report, an attempt's end), never per step.

Example::

    ledger = storage.ledger_file("driver")
    ledger.append({"event": "launch", "t": time.time()})
    entries = storage.read_ledger()
"""

from __future__ import annotations

import collections
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import fsspec

from elastic_train.storage import filesystem as fsutil
from elastic_train.storage.jsonl_log import SEGMENTS_SUFFIX, JsonLinesLog, ReadCache, read_log

logger = logging.getLogger(__name__)

IDLE_S = 30.0  # a ledger's writer thread ends this long after its last line


class LedgerFile:
    """One writer's file of the ledger in ``directory``; ``fenced(what)`` checks the
    run's lease before a write (see :meth:`RunStorage.use_fence`)."""

    def __init__(self, fs: fsspec.AbstractFileSystem, directory: str, source: str,
                 fenced: Callable[[str], None] = lambda what: None):
        self.fs = fs
        self.path = fsutil.join(directory, f"{source}-{time.time_ns()}-{os.getpid()}.jsonl")
        self._log = JsonLinesLog(fs, self.path, new=True)
        self._fenced = fenced
        self._made = False  # whether the directory was made
        self._pending: list[bytes] = []  # lines a failed write left
        self._warned = False

    def append(self, *entries: dict[str, Any]) -> None:
        """Adds ``entries``, one line each (best effort: see the module's docstring)."""
        self._pending += [(json.dumps(e) + "\n").encode() for e in entries]
        try:
            self._fenced("writing the goodput ledger")
            if not self._made:
                self.fs.makedirs(self.path.rpartition("/")[0], exist_ok=True)
                self._made = True
            self._log.append(self._pending)
        except Exception as exc:  # the store's own errors vary; a lost lease too: never fatal
            if not self._warned:
                self._warned = True
                logger.warning("Could not write the goodput ledger %s (%s: %s): training goes "
                               "on; `elastic-train show` will miss these figures until a "
                               "later write succeeds.", fsutil.display_path(self.fs, self.path),
                               type(exc).__name__, exc)
            return
        self._pending = []


class QueuedLedger:
    """A :class:`LedgerFile` written from a thread of its own: :meth:`append` only queues,
    so a slow or unreachable store never holds the caller (rank 0's training thread).

    The thread runs while lines come and ends :data:`IDLE_S` after the last, or as soon
    as the queue is empty once :meth:`close` was called (an attempt's end, however it
    ended: an in-process restart leaves no thread of the failed attempt behind; a new
    line starts it again: started per line, a thread would cost more than a line on
    local disk). At most ``max_queued`` lines wait: beyond, the oldest are dropped, with
    one warning (a store down for that long loses figures, never training time).
    :meth:`flush` waits, up to a bound, until every queued line was handed to the file.
    """

    def __init__(self, ledger: LedgerFile, max_queued: int = 1000):
        self.ledger = ledger
        self._max = max_queued
        self._queue: collections.deque[dict[str, Any]] = collections.deque()
        self._cond = threading.Condition()
        self._running = False  # the thread is started
        self._writing = False  # it writes a batch now
        self._closing = False  # close() was called: the thread ends once nothing waits
        self._warned = False

    def append(self, *entries: dict[str, Any]) -> None:
        """Queues ``entries`` for the file (see the class)."""
        with self._cond:
            self._queue.extend(entries)
            dropped = len(self._queue) - self._max
            for _ in range(max(dropped, 0)):
                self._queue.popleft()
            if dropped > 0 and not self._warned:
                self._warned = True
                logger.warning("The goodput ledger %s is %d lines behind its store: the "
                               "oldest are dropped; `elastic-train show` will miss them.",
                               fsutil.display_path(self.ledger.fs, self.ledger.path), self._max)
            if not self._running:
                self._running = True
                threading.Thread(target=self._drain, name="elastic-train-ledger",
                                 daemon=True).start()
            self._cond.notify_all()

    def _drain(self) -> None:
        """The thread: writes what is queued until nothing is (see :meth:`_take`)."""
        batch = self._take()
        try:
            while batch:
                self.ledger.append(*batch)  # best effort: it keeps what it could not write
                batch = self._take()
        except BaseException:
            with self._cond:
                self._running = self._writing = False
                self._cond.notify_all()
            raise

    def _take(self) -> list[dict[str, Any]]:
        """The lines queued, or that come within :data:`IDLE_S`, emptying the queue; none:
        the thread ends (said under the lock, so the next :meth:`append` starts another)."""
        with self._cond:
            self._writing = False
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._queue or self._closing, IDLE_S)
            batch = list(self._queue)
            self._queue.clear()
            self._writing = bool(batch)
            self._running = bool(batch)
            self._cond.notify_all()  # a close() waits for the thread's end
            return batch

    def flush(self, timeout_s: float) -> bool:
        """Waits up to ``timeout_s`` for the queued lines to be written; False: still not."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._writing,
                                       timeout_s)

    def close(self, timeout_s: float) -> bool:
        """Waits up to ``timeout_s`` for the queued lines to be written and the thread to
        end; False: still not (it ends once its store takes the lines)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            return self._cond.wait_for(lambda: not self._queue and not self._running,
                                       timeout_s)


def read_ledger(fs: fsspec.AbstractFileSystem, directory: str,
                cache: ReadCache | None = None) -> list[dict[str, Any]]:
    """Every line of every writer's file in ``directory``, whether a file or segments
    (a line that is not a JSON object, cut short by a crash, is skipped); [] without a
    ledger. ``cache``: see :func:`.jsonl_log.read_log`."""
    entries = []
    names = {name.removesuffix(SEGMENTS_SUFFIX) for name in fsutil.names_in(fs, directory)}
    for name in sorted(n for n in names if n.endswith(".jsonl")):
        data = read_log(fs, fsutil.join(directory, name), lambda path: _read_file(fs, path),
                        cache)
        for line in (data or b"").decode(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict):
                entries.append(entry)
    return entries


def _read_file(fs: fsspec.AbstractFileSystem, path: str) -> bytes | None:
    """``path``'s bytes, None when it is gone (a listing can outlive the file)."""
    try:
        return fsutil.read_bytes(fs, path)
    except FileNotFoundError:
        return None
