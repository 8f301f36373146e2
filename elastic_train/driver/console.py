"""The driver's console: worker output prefixed by rank, and a live status line.

Workers write only to their log files (torch.distributed.elastic's
``attempt_N/<local rank>/stdout.log`` layout); :class:`LogTail` follows those
files and prints each new line as ``[rank N]: ...``. Owning the console lets
the status line stay at the bottom of a terminal: it is cleared before worker
lines are printed and drawn again after them.
"""

from __future__ import annotations

import glob
import os
import shutil
import threading
from collections.abc import Callable
from typing import TextIO


class Console:
    """Serialises writes to one stream; keeps a status line at the bottom of a terminal."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.tty = stream.isatty()
        self._lock = threading.Lock()
        self._status = ""

    def lines(self, texts: list[str]) -> None:
        with self._lock:
            if self.tty and self._status:
                self.stream.write("\r\033[K")
            self.stream.write("".join(t + "\n" for t in texts))
            if self.tty and self._status:
                self.stream.write(self._status)
            self.stream.flush()

    def status(self, text: str) -> None:
        """Shows ``text`` as the status line (terminals only)."""
        if not self.tty:
            return
        # One row only: "\r\033[K" clears one row, so a wrapped line would leave copies.
        text = text[: shutil.get_terminal_size((120, 24)).columns - 1]
        with self._lock:
            self._status = text
            self.stream.write("\r\033[K" + text)
            self.stream.flush()

    def end_status(self) -> None:
        with self._lock:
            if self.tty and self._status:
                self.stream.write("\n")
                self.stream.flush()
            self._status = ""


class LogTail:
    """Follows every worker log file under ``log_dir`` and prints new lines with a prefix.

    ``prefix(local_rank)`` names the worker (e.g. ``"[rank3]: "``);
    ``local_ranks`` limits the console to some local ranks (torchrun's
    ``--local-ranks-filter``) and ``streams`` to stdout and/or stderr
    (``--redirects``/``--tee``); the files always get everything.
    """

    def __init__(self, log_dir: str, console: Console, prefix: Callable[[int], str],
                 local_ranks: set[int] | None = None,
                 streams: frozenset[str] = frozenset({"stdout", "stderr"})):
        self.log_dir = log_dir
        self.console = console
        self.prefix = prefix
        self.local_ranks = local_ranks
        self.streams = streams
        self._files: dict[str, tuple[int, str, bytes]] = {}  # path -> (offset, prefix, partial)
        # Files from earlier launches of the run (a restore reuses the log directory)
        # were shown then: follow them from their current end only.
        for path, local_rank in self._paths():
            self._files[path] = (os.path.getsize(path), self.prefix(local_rank), b"")

    def _paths(self) -> list[tuple[str, int]]:
        """The log files to show, with their local ranks."""
        pattern = os.path.join(self.log_dir, "**", "attempt_*", "*", "std*.log")
        out = []
        for path in sorted(glob.glob(pattern, recursive=True)):
            local_rank = int(os.path.basename(os.path.dirname(path)))
            if self.local_ranks is not None and local_rank not in self.local_ranks:
                continue
            if os.path.basename(path)[:-4] in self.streams:
                out.append((path, local_rank))
        return out

    def poll(self, final: bool = False) -> None:
        for path, local_rank in self._paths():
            if path not in self._files:
                self._files[path] = (0, self.prefix(local_rank), b"")
            self._read(path, final)

    def _read(self, path: str, final: bool) -> None:
        offset, prefix, partial = self._files[path]
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except OSError:
            return
        text = partial + data
        lines = text.split(b"\n")
        partial = lines.pop()
        if final and partial:
            lines.append(partial)
            partial = b""
        self._files[path] = (offset + len(data), prefix, partial)
        if lines:
            self.console.lines([prefix + line.decode(errors="replace").rstrip("\r")
                                for line in lines])
