"""The run directory: ``<storage_path>/<name>/`` and what lives in it (its entries are
named in :mod:`.run_state`).

The run directory is the source of truth for resuming: a new attempt reads
its checkpoints and metrics from here, never from memory. One job at a time
writes it: its lease lives beside it, in ``<storage_path>/.leases/<name>/``
(:mod:`.lease`), and with :meth:`RunStorage.use_fence` every write that could
harm a newer job's run first checks that lease.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

import fsspec

from elastic_train._internal import moved_modules
from elastic_train._internal.departures import Departure
from elastic_train.errors import ConfigError, StorageError
from elastic_train.storage import filesystem as fsutil
from elastic_train.storage.checkpoint_store import CheckpointStore
from elastic_train.storage.jsonl_log import JsonLinesLog, ReadCache, read_log
from elastic_train.storage.lease import LeaseDir, LeaseFence, lease_path
from elastic_train.storage.ledger_file import LedgerFile, read_ledger
from elastic_train.storage.retry import RetryPolicy
from elastic_train.storage.run_state import (
    DEPARTURES_DIR,
    GOODPUT_DIR,
    LOGS_DIR,
    METRICS_FILE,
    RESTORES_FILE,
    RUN_FILE,
    TRAINABLE_FILE,
    RestoreRecord,
    RunState,
)
from elastic_train.storage.stores import adapter_for

if TYPE_CHECKING:
    from elastic_train.config import RunConfig

logger = logging.getLogger(__name__)

T = TypeVar("T")

RUN_FORMAT_VERSION = 1
# A metric row is appended at every report(): its lease check may be this old.
_ROW_FENCE_AGE_S = 2.0


class RunStorage:
    """One run's directory on any fsspec store.

    Example::

        storage = RunStorage.open("/tmp/results", "digits")
        storage.write_run_state({"status": "running"})
    """

    def __init__(self, fs: fsspec.AbstractFileSystem, run_path: str,
                 retry: RetryPolicy | None = None):
        self.fs = fs
        self.run_path = run_path.rstrip("/")
        self.adapter = adapter_for(fs)
        self.retry = (retry or RetryPolicy()).for_store(self.adapter)
        self.checkpoints = CheckpointStore(fs, self.run_path, self.retry)
        self.fence: LeaseFence | None = None
        self._metrics_log = JsonLinesLog(fs, self._path(METRICS_FILE))
        self._read_cache: ReadCache = {}  # the segments read so far (a poller's next read)

    @classmethod
    def open(cls, storage_path: str, name: str,
             filesystem: fsspec.AbstractFileSystem | None = None,
             options: dict[str, Any] | None = None,
             retry: RetryPolicy | None = None) -> RunStorage:
        fs, root = fsutil.resolve(storage_path, filesystem, options)
        return cls(fs, fsutil.join(root, name), retry)

    @classmethod
    def for_run(cls, run_config: RunConfig, name: str) -> RunStorage:
        """The run directory a ``RunConfig`` names."""
        return cls.open(run_config.storage_path, name, run_config.storage_filesystem,
                        run_config.storage_options,
                        RetryPolicy(budget_s=run_config.storage_retry_timeout_s))

    def _retry(self, what: str, fn: Callable[[], T]) -> T:
        return self.retry.call(what, self.display_path, fn)

    def lease_dir(self, retry_budget_s: float | None = None) -> LeaseDir:
        """The run's lease on this store (see :mod:`.lease`); ``retry_budget_s`` bounds its
        retries (default: the run's storage retry budget)."""
        retry = self.retry if retry_budget_s is None else replace(self.retry,
                                                                  budget_s=retry_budget_s)
        return LeaseDir(self.fs, lease_path(self.run_path), retry)

    def use_fence(self, token: int | None) -> None:
        """From now on, writes of this job (lease ``token``; None: unchecked) first check
        that no newer job took the run over: LeaseLostError instead of the write."""
        self.fence = None if token is None else LeaseFence(self.lease_dir(), token,
                                                           self.display_path)
        self.checkpoints.fence = self.fence

    def _fenced(self, what: str, max_age_s: float = 0.0) -> None:
        if self.fence is not None:
            self.fence.check(what, max_age_s)

    @property
    def display_path(self) -> str:
        return fsutil.display_path(self.fs, self.run_path)

    @property
    def is_local(self) -> bool:
        return self.adapter.is_local

    def _path(self, name: str) -> str:
        return fsutil.join(self.run_path, name)

    def ensure_writable(self) -> None:
        """Creates the run directory and proves a write works, or says why not.

        On an object store the bucket must exist already: a prefix inside it is
        created by the first write, a bucket is never (a typo would make a new one).
        """
        probe = self._path(f".write-probe-{uuid.uuid4().hex[:8]}")
        try:
            bucket = self.adapter.missing_bucket(self.run_path)
            if bucket is not None:
                raise ConfigError(
                    f"The bucket {self.fs.unstrip_protocol(bucket)} of the run directory "
                    f"{self.display_path} does not exist: fix the bucket name in "
                    "RunConfig(storage_path=...) or create the bucket first."
                )
            if self.fs.isfile(self.run_path):
                raise ConfigError(
                    f"The run directory {self.display_path} is an existing file: choose "
                    "another RunConfig(storage_path=..., name=...)."
                )
            self.fs.makedirs(self.run_path, exist_ok=True)
            self.fs.pipe_file(probe, b"ok")
            self.fs.rm(probe)
        except ConfigError:
            raise
        except Exception as exc:  # the store's own error type varies
            # (from None: the store's traceback, 60 lines of botocore, says less than this)
            raise ConfigError(
                f"Cannot write to the run directory {self.display_path} "
                f"({type(exc).__name__}: {exc}): {self.adapter.access_hint}; or choose a "
                "writable RunConfig(storage_path=...)."
            ) from None

    def round_trip(self) -> None:
        """Writes a small probe file into the run directory, reads it back and removes it
        (a node's storage health check, :mod:`elastic_train.agent.health_checks`); raises
        the store's error, or OSError when what came back differs."""
        probe = self._path(f".health-probe-{uuid.uuid4().hex[:8]}")
        data = os.urandom(4096)
        try:
            self.fs.pipe_file(probe, data)
            self.fs.invalidate_cache(probe)
            back = self.fs.cat_file(probe)
        finally:
            with contextlib.suppress(Exception):  # a store that failed above may fail here
                self.fs.rm(probe)
        if back != data:
            raise OSError(f"{self.display_path}: a 4 KiB probe read back as {len(back)} "
                          "bytes that differ from those written")

    def discard_unfinished_uploads(self) -> None:
        """Removes what uploads cut short left (directories without a commit marker,
        open multipart uploads), once and without retries: for the driver of a run
        that failed, so the store holds no partial checkpoint until a next start
        (which does the same). A store that is down is left as it is."""
        store = CheckpointStore(self.fs, self.run_path, RetryPolicy(budget_s=0), self.fence)
        try:
            store.remove_uncommitted()
        except Exception as exc:  # never hide the run's own error behind this one
            logger.warning("Could not remove unfinished uploads from %s: %r",
                           self.display_path, exc)

    def check_reachable(self) -> None:
        """One look at the run directory without retries, before the first retried read of
        a restore: a store that cannot be reached at all (a refused connection, an unknown
        host, no credentials) is a wrong setting there, not an outage to wait out. A
        StorageError naming the cause and what to check comes in seconds, as ``ls`` and
        ``show`` answer, not after the retry budget."""
        try:
            self.fs.exists(self.run_path)
        except Exception as exc:  # the store's own error types vary (botocore, OSError, ...)
            raise StorageError(f"cannot reach {self.display_path} ({type(exc).__name__}: "
                               f"{exc}); {self.adapter.access_hint}") from exc

    # run.json: the driver's record of the run
    def _read_unless_missing(self, name: str, what: str, read: Callable[[str], T]) -> T | None:
        """``read`` of the run's file ``name``, None when it is missing (confirmed by a
        fresh listing: see :func:`.filesystem.read_unless_missing`)."""
        return self._retry(what, lambda: fsutil.read_unless_missing(
            self.fs, self._path(name), read))

    def read_run_state(self) -> RunState | None:
        """The run's record, or None when there is no ``run.json``. Whatever else the
        file holds (it comes from shared storage) is a :class:`StorageError` naming it."""
        try:
            found = self._read_unless_missing(RUN_FILE, "reading run.json",
                                              lambda p: (fsutil.read_json(self.fs, p),))
        except ValueError as exc:
            raise StorageError(f"{self.display_path}/{RUN_FILE} is not valid JSON ({exc}): it "
                               "was cut short or edited; restore it from a copy, or move the "
                               "run directory aside") from exc
        except OSError as exc:
            raise StorageError(f"Cannot read {self._path(RUN_FILE)}: {exc!r}") from exc
        if found is None:
            return None
        state = found[0]
        version = state.get("format_version", 0) if isinstance(state, dict) else 0
        if isinstance(version, int) and version > RUN_FORMAT_VERSION:
            raise StorageError(
                f"{self.display_path}/{RUN_FILE} has format_version {version}, newer than this "
                f"elastic-train understands ({RUN_FORMAT_VERSION}): upgrade elastic-train."
            )
        try:
            if not isinstance(state, dict) or not isinstance(version, int):
                raise TypeError(f"a JSON object with an integer format_version expected, "
                                f"not {type(state).__name__}")
            return RunState.from_json(state)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StorageError(f"{self.display_path}/{RUN_FILE} is not a run record this "
                               f"elastic-train can read: {exc!r}") from exc

    def write_run_state(self, state: RunState) -> None:
        self._fenced("writing run.json")
        data = {**state.to_json(), "format_version": RUN_FORMAT_VERSION}
        self._retry("writing run.json",
                    lambda: fsutil.write_json_atomic(self.fs, self._path(RUN_FILE), data))

    # metrics.jsonl: rank 0's reports (segments where the store cannot append: .jsonl_log)
    def read_metrics(self) -> list[dict[str, Any]]:
        """Every row of ``metrics.jsonl``, oldest first: the one reader of the rows, in
        either layout (see :mod:`.jsonl_log`)."""
        def read(path: str) -> bytes | None:
            return fsutil.read_unless_missing(self.fs, path,
                                              lambda p: fsutil.read_bytes(self.fs, p))

        data = self._retry("reading metrics.jsonl", lambda: read_log(
            self.fs, self._path(METRICS_FILE), read, self._read_cache)) or b""
        rows = []
        for line in data.decode().splitlines():
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    break  # a line cut short by a crash ends the history
        return rows

    def write_metrics(self, rows: list[dict[str, Any]]) -> None:
        """Replaces the rows with ``rows`` (a resume's kept rows, a validation's metrics)."""
        self._fenced("writing metrics.jsonl")
        self._retry("writing metrics.jsonl", lambda: self._metrics_log.rewrite(_lines(rows)))

    def append_metrics(self, row: dict[str, Any], history: list[dict[str, Any]]) -> None:
        """Adds ``row``; ``history`` (every row, ``row`` last) serves a store without append
        the first time this process writes there (see :meth:`.JsonLinesLog.append`): a
        row costs the same however many came before it."""
        self._fenced("appending to metrics.jsonl", _ROW_FENCE_AGE_S)
        self._retry("appending to metrics.jsonl", lambda: self._metrics_log.append(
            _lines([row]), lambda: _lines(history[:-1])))

    # restores.json: rank 0's account of each restart (for goodput)
    def read_restores(self) -> list[RestoreRecord]:
        entries = self._read_unless_missing(RESTORES_FILE, "reading restores.json",
                                            lambda p: fsutil.read_json(self.fs, p))
        return [RestoreRecord.from_json(entry) for entry in entries or []]

    def add_restore(self, entry: RestoreRecord) -> None:
        """Appends one restart's entry: when the group was ready again, from which
        iteration, and how much of the failed attempt's work is redone."""
        self._write_restores([*self.read_restores(), entry])

    def note_restore_data(self, said: str) -> None:
        """Adds to the latest restart's entry what its resume did to the data."""
        entries = self.read_restores()
        if entries:
            last = entries[-1]
            self._write_restores([*entries[:-1], replace(last, data=(*last.data, said))])

    def _write_restores(self, entries: list[RestoreRecord]) -> None:
        self._fenced("writing restores.json")
        self._retry("writing restores.json", lambda: fsutil.write_json_atomic(
            self.fs, self._path(RESTORES_FILE), [e.to_json() for e in entries]))

    # goodput/: where the run's time goes (see elastic_train.goodput.breakdown)
    def ledger_file(self, source: str) -> LedgerFile:
        """A new file of the run's goodput ledger, written by this process alone."""
        return LedgerFile(self.fs, self._path(GOODPUT_DIR), source,
                          lambda what: self._fenced(what, _ROW_FENCE_AGE_S))

    def read_ledger(self) -> list[dict[str, Any]]:
        """Every line of the run's goodput ledger, of every writer."""
        return self._retry("reading the goodput ledger",
                           lambda: read_ledger(self.fs, self._path(GOODPUT_DIR),
                                               self._read_cache))

    # departures/: who left the job and until when it is kept out (see departures.py)
    def write_departure(self, departure: Departure) -> None:
        """Records that a node left; replaces its earlier departure, if any."""
        self._fenced("writing a departure")
        path = fsutil.join(self._path(DEPARTURES_DIR), departure.file_name)
        self._retry("writing a departure", lambda: fsutil.write_json_atomic(
            self.fs, path, departure.to_json()))

    def read_departures(self) -> list[Departure]:
        """Every node that left the job, oldest first (a file that is not a departure is
        skipped with a warning: admission must not fail on it)."""
        directory = self._path(DEPARTURES_DIR)

        def read() -> list[Departure]:
            found = []
            for name in sorted(fsutil.names_in(self.fs, directory)):
                try:
                    found.append(Departure.from_json(fsutil.read_json(
                        self.fs, fsutil.join(directory, name))))
                except FileNotFoundError:
                    continue
                except (ValueError, KeyError, TypeError, AttributeError) as exc:
                    logger.warning("Skipping %s/%s/%s: not a departure (%r).",
                                   self.display_path, DEPARTURES_DIR, name, exc)
            return found

        return sorted(self._retry("reading departures", read), key=lambda d: d.left_at)

    # trainable.pkl: the pickled RunSpec, so restore(path) needs no code
    def write_trainable(self, data: bytes) -> None:
        self._fenced("writing trainable.pkl")
        self._retry("writing trainable.pkl", lambda: fsutil.write_bytes_atomic(
            self.fs, self._path(TRAINABLE_FILE), data))

    def read_trainable(self) -> Any:
        # a run saved before a module moved names its old path
        return moved_modules.loads(self._retry("reading trainable.pkl", lambda: fsutil.read_bytes(
            self.fs, self._path(TRAINABLE_FILE))))

    def has_trainable(self) -> bool:
        return self._retry("looking for trainable.pkl",
                           lambda: self.fs.exists(self._path(TRAINABLE_FILE)))

    def upload_logs(self, local_dir: str) -> None:
        """Copies a local log directory into the run's ``logs/`` (remote stores)."""
        self._retry("uploading logs", lambda: self.fs.put(
            local_dir.rstrip("/") + "/", self.log_dir() + "/", recursive=True))

    def log_dir(self) -> str:
        return self._path(LOGS_DIR)


def _lines(rows: list[dict[str, Any]]) -> list[bytes]:
    """``rows`` as JSON lines."""
    return [(json.dumps(r) + "\n").encode() for r in rows]
