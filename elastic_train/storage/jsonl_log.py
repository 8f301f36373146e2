"""An append-only log of JSON lines on any store: ``metrics.jsonl`` and each writer's file
of the goodput ledger.

Where the store appends (local disk, NFS: :meth:`StoreAdapter.append`), the log is one
file at its path, appended to. Where it cannot (S3: an object is written whole), writing
the file again at every line would cost what the log holds so far, and the bytes a run
uploads would grow with the square of its lines. There the lines go to numbered segment
objects beside the path, ``<path>.d/000000.jsonl``, ``000001.jsonl``, ...: a segment
takes lines up to :data:`SEGMENT_BYTES` (or one longer line), and an append writes only
the segments its lines land in, so a line costs the same however long the log is.

:func:`read_log` is the one reader: the segments in order, up to the first that is
missing; without a segment 0, the single file (a run directory written before segments,
or on local disk). An append writes its segments in order, so a crash leaves a prefix.
A rewrite (:meth:`JsonLinesLog.rewrite`) first removes the segments past its new end,
the last first, then writes the others from the last down to segment 0: a crash midway
leaves every segment old or new, none past the new end, and a log that was a single
file stays that file until its segment 0 is written.

Example::

    log = JsonLinesLog(fs, "/runs/a/metrics.jsonl")
    log.append([b'{"loss": 1.0}\\n'])
    data = read_log(fs, "/runs/a/metrics.jsonl", fs.cat_file)
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import fsspec

from elastic_train.errors import StorageError
from elastic_train.storage import filesystem as fsutil
from elastic_train.storage.stores import adapter_for

SEGMENT_BYTES = 64 << 10  # what one append rewrites at most (besides a line that is longer)
SEGMENTS_SUFFIX = ".d"  # the segments of log ``x.jsonl`` are in ``x.jsonl.d/``
_SEGMENT = re.compile(r"(\d{6,})\.jsonl")


def segment_path(path: str, number: int) -> str:
    """Where segment ``number`` of log ``path`` is."""
    return fsutil.join(path + SEGMENTS_SUFFIX, f"{number:06d}.jsonl")


@dataclass
class _Segments:
    """The segments a writer stored: how many are full, and the lines of the last."""

    full: int = 0
    last: list[bytes] = field(default_factory=list)

    def copy(self) -> _Segments:
        return _Segments(self.full, list(self.last))

    def add(self, lines: Sequence[bytes]) -> dict[int, bytes]:
        """Puts ``lines`` after the others, each segment filled up to
        :data:`SEGMENT_BYTES` in turn; returns what the segments they went to now hold,
        by number."""
        touched: dict[int, bytes] = {}
        size = sum(map(len, self.last))
        for line in lines:
            if self.last and size + len(line) > SEGMENT_BYTES:
                if self.full in touched:
                    touched[self.full] = b"".join(self.last)
                self.full, self.last, size = self.full + 1, [], 0
            touched[self.full] = b""
            self.last.append(line)
            size += len(line)
        if self.full in touched:
            touched[self.full] = b"".join(self.last)
        return touched


class JsonLinesLog:
    """One writer's log at ``path`` (see the module); ``new``: the writer made the name up
    and nothing is stored there yet. One writer at a time (a run's lease makes sure), and
    one caller: a writer that wrote the segments does not look at them again until its
    next :meth:`rewrite` (rank 0 rewrites the metrics at every attempt's start).

    A write that raises leaves what the writer knows as it was, so the same call again
    (with the lines it did not write) writes them all.
    """

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str, new: bool = False):
        self.fs = fs
        self.path = path
        self._adapter = adapter_for(fs)
        self._segments = _Segments() if new else None  # None: what is stored is not known

    def append(self, lines: Sequence[bytes], before: Callable[[], Sequence[bytes]] = list) -> None:
        """Adds ``lines`` (each ending in a newline). ``before`` gives the log's lines ahead
        of them: on a store without append, a writer that has not written the log since
        its last :meth:`rewrite` (or did not make it) writes them all once."""
        if self._adapter.appends:
            self._adapter.append(self.path, b"".join(lines))
        elif self._segments is None:
            self.rewrite([*before(), *lines])
        else:
            segments = self._segments.copy()
            self._put(segments.add(lines))
            self._segments = segments

    def rewrite(self, lines: Sequence[bytes]) -> None:
        """Replaces the log's lines with ``lines``, whoever wrote it before (see the
        module for the order, which a crash leaves readable)."""
        if self._adapter.appends:
            fsutil.write_bytes_atomic(self.fs, self.path, b"".join(lines))
            self._remove_segments(0)
            return
        segments = _Segments()
        contents = segments.add(lines)
        self._remove_segments(len(contents))
        self._put(contents, reverse=True)
        self._remove(self.path)  # the single file of a log written before segments
        self._segments = segments

    def _put(self, contents: dict[int, bytes], reverse: bool = False) -> None:
        for number in sorted(contents, reverse=reverse):
            fsutil.write_bytes_atomic(self.fs, segment_path(self.path, number), contents[number])

    def _remove_segments(self, start: int) -> None:
        """Removes the segments from number ``start`` on, the last first (any past a gap
        too: an append could otherwise close the gap and bring them back)."""
        for number in reversed(_segment_numbers(self.fs, self.path)):
            if number >= start:
                self._remove(segment_path(self.path, number))

    def _remove(self, path: str) -> None:
        self.fs.invalidate_cache(path)  # a listing cached earlier may say it is gone
        try:
            if self.fs.exists(path):
                self.fs.rm(path)
        except FileNotFoundError:
            pass


def _segments_stored(fs: fsspec.AbstractFileSystem, path: str) -> dict[int, Hashable]:
    """Log ``path``'s segments as the store lists them now: each one's version, by number."""
    directory = path + SEGMENTS_SUFFIX
    fs.invalidate_cache(directory)
    try:
        entries = fs.ls(directory, detail=True)
    except FileNotFoundError:
        return {}
    adapter, stored = adapter_for(fs), {}
    for entry in entries:
        if m := _SEGMENT.fullmatch(entry["name"].rstrip("/").rsplit("/", 1)[-1]):
            _check_segment(entry)
            stored[int(m.group(1))] = adapter.version(entry)
    return stored


def _check_segment(entry: dict[str, Any]) -> None:
    """Refuses, before it is read, a segment that is no regular file (a FIFO is read for
    ever) or larger than any file elastic-train writes."""
    if entry.get("type") != "file":
        raise StorageError(f"{entry['name']} is not a regular file: no file elastic-train "
                           "writes is; move it aside")
    if (entry.get("size") or 0) > fsutil.READ_LIMIT:
        raise StorageError(f"{entry['name']} is larger than {fsutil.READ_LIMIT} bytes, more "
                           "than any record elastic-train writes: it is damaged; move it aside")


def _segment_numbers(fs: fsspec.AbstractFileSystem, path: str) -> list[int]:
    """The numbers of log ``path``'s segments, in order."""
    return sorted(_segments_stored(fs, path))


#: What a reader read of a log's segments: ``{segment path: (version, bytes)}``.
ReadCache = dict[str, tuple[Hashable, bytes]]


def read_log(fs: fsspec.AbstractFileSystem, path: str,
             read_file: Callable[[str], bytes | None],
             cache: ReadCache | None = None) -> bytes | None:
    """The bytes of log ``path``: its segments in order, up to the first that is missing;
    without segments, ``read_file(path)`` (None: there is no log). With ``cache`` (kept
    by the caller from one read to the next), a segment is fetched again only when its
    version changed: a reader that polls fetches the last segment, not the log."""
    stored = _segments_stored(fs, path)
    numbers = list(itertools.takewhile(stored.__contains__, itertools.count()))
    if not numbers:
        return read_file(path)
    known = cache if cache is not None else {}
    paths = {segment_path(path, n): stored[n] for n in numbers}
    wanted = [p for p, version in paths.items() if known.get(p, (None,))[0] != version]
    fetched = fs.cat(wanted, on_error="omit") if wanted else {}  # s3fs: all at once
    parts = []
    for segment, version in paths.items():
        if segment in fetched:
            known[segment] = (version, fetched[segment])
        elif segment in wanted:
            break  # removed since the listing: the log ends before it
        parts.append(known[segment][1])
    return b"".join(parts)
