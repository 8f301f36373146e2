"""The driver's console: worker output prefixed by rank, live progress bars, a status line.

Workers write only to their log files (torch.distributed.elastic's
``attempt_N/<local rank>/stdout.log`` layout); :class:`LogTail` follows those
files and prints each new line as ``[rank N]: ...``. Owning the console lets
the status line stay at the bottom of a terminal: it is cleared before worker
lines are printed and drawn again after them. A line a worker is still
rewriting with ``\r`` (a tqdm or Lightning progress bar) is shown live above
the status line, with its prefix, until the worker ends it with a newline;
when stdout is not a terminal it is printed as a plain line at most every
few seconds instead.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import string
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TextIO

BOTH = frozenset({"stdout", "stderr"})


@dataclass(frozen=True)
class ConsoleView:
    """Which workers' output the console shows, and how it names them (the log files always
    get everything): torchrun's ``--local-ranks-filter``, ``--redirects``/``--tee`` (per
    local rank) and ``--log-line-prefix-template``.

    Attributes:
        local_ranks: Local ranks shown (None: all).
        streams_by_rank: The streams shown of each local rank; a rank not in it shows both.
        prefix_template: torchrun's template (``${role_name}``, ``${rank}``,
            ``${local_rank}``, ``${hostname}``); None: ``[rankN]: ``.
        role: The workers' role, for ``${role_name}``.
    """

    local_ranks: frozenset[int] | None = None
    streams_by_rank: Mapping[int, frozenset[str]] = field(default_factory=dict)
    prefix_template: str | None = None
    role: str = "default"

    def shows(self, local_rank: int, stream: str) -> bool:
        if self.local_ranks is not None and local_rank not in self.local_ranks:
            return False
        return stream in self.streams_by_rank.get(local_rank, BOTH)

    def prefix(self, rank: int, local_rank: int) -> str | None:
        """The template's prefix for a worker; None without a template."""
        if self.prefix_template is None:
            return None
        return string.Template(self.prefix_template).safe_substitute(
            role_name=self.role, rank=rank, local_rank=local_rank,
            hostname=socket.gethostname())


def _shown(line: bytes) -> str:
    """What a terminal would show of a line rewritten with ``\r``: its last part."""
    parts = [p for p in line.rstrip(b"\r").split(b"\r") if p] or [b""]
    return parts[-1].decode(errors="replace")


class Console:
    """Serialises writes to one stream; keeps live rows (progress bars, then the status
    line) at the bottom of a terminal.

    ``progress_every_s``: off a terminal, how often one worker's progress bar is printed
    as a plain line.
    """

    def __init__(self, stream: TextIO, progress_every_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic):
        self.stream = stream
        self.tty = stream.isatty()
        self.progress_every_s = progress_every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._status = ""
        self._progress: dict[str, str] = {}  # key -> the worker's live line
        self._printed: dict[str, float] = {}  # key -> when its progress was last printed
        self._rows = 0  # live rows on the screen now

    def _clear(self) -> None:
        """Removes the live rows; the cursor ends where the first of them began."""
        if self._rows:
            self.stream.write("\r\033[K" + "\033[A\033[K" * (self._rows - 1))
        self._rows = 0

    def _draw(self) -> None:
        # One screen row each: a wrapped row would not be cleared, so it would repeat.
        width = shutil.get_terminal_size((120, 24)).columns - 1
        rows = [text[:width] for text in (*self._progress.values(), self._status) if text]
        self.stream.write("\n".join(rows))
        self._rows = len(rows)

    def lines(self, texts: list[str], done: str | None = None) -> None:
        """Prints ``texts``; ``done``: the key of a live line they complete."""
        with self._lock:
            if self.tty:
                self._clear()
            self.stream.write("".join(t + "\n" for t in texts))
            if done is not None:
                self._progress.pop(done, None)
                self._printed.pop(done, None)
            if self.tty:
                self._draw()
            self.stream.flush()

    def progress(self, key: str, text: str) -> None:
        """Shows ``text`` as the live line ``key`` (a worker's progress bar)."""
        with self._lock:
            if not self.tty:
                now = self._clock()
                if now - self._printed.get(key, -self.progress_every_s) < self.progress_every_s:
                    return
                self._printed[key] = now
                self.stream.write(text + "\n")
            else:
                self._clear()
                self._progress[key] = text
                self._draw()
            self.stream.flush()

    def status(self, text: str) -> None:
        """Shows ``text`` as the status line (terminals only)."""
        if not self.tty:
            return
        with self._lock:
            self._clear()
            self._status = text
            self._draw()
            self.stream.flush()

    def end_status(self) -> None:
        """Leaves the live rows on the screen as they are, and stops drawing them."""
        with self._lock:
            if self.tty and self._rows:
                self.stream.write("\n")
                self.stream.flush()
            self._status, self._progress, self._rows = "", {}, 0


class LogTail:
    """Follows every worker log file under ``log_dir`` and prints new lines with a prefix.

    ``prefix(local_rank)`` names the worker (e.g. ``"[rank3]: "``), asked at each read:
    a worker that took another rank in process (a re-formed world) keeps its log
    file; ``view`` says which local ranks and streams the console shows (the files
    always get everything).
    """

    def __init__(self, log_dir: str, console: Console, prefix: Callable[[int], str],
                 view: ConsoleView | None = None):
        self.log_dir = log_dir
        self.console = console
        self.prefix = prefix
        self.view = view or ConsoleView()
        self._files: dict[str, tuple[int, bytes]] = {}  # path -> (offset, partial line)
        # Files from earlier launches of the run (a restore reuses the log directory)
        # were shown then: follow them from their current end only.
        for path, _ in self._paths():
            self._files[path] = (os.path.getsize(path), b"")

    def _paths(self) -> list[tuple[str, int]]:
        """The log files to show, with their local ranks."""
        pattern = os.path.join(self.log_dir, "**", "attempt_*", "*", "std*.log")
        out = []
        for path in sorted(glob.glob(pattern, recursive=True)):
            local_rank = int(os.path.basename(os.path.dirname(path)))
            if self.view.shows(local_rank, os.path.basename(path)[:-4]):
                out.append((path, local_rank))
        return out

    def poll(self, final: bool = False) -> None:
        for path, local_rank in self._paths():
            if path not in self._files:
                self._files[path] = (0, b"")
            self._read(path, local_rank, final)

    def _read(self, path: str, local_rank: int, final: bool) -> None:
        offset, partial = self._files[path]
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except OSError:
            return
        if not data and not (final and partial):
            return
        lines = (partial + data).split(b"\n")
        partial = lines.pop()
        if final and partial:
            lines.append(partial)
            partial = b""
        self._files[path] = (offset + len(data), partial)
        prefix = self.prefix(local_rank)
        if lines:
            self.console.lines([prefix + _shown(line) for line in lines], done=path)
        if b"\r" in partial and _shown(partial):  # a progress bar being redrawn
            self.console.progress(path, prefix + _shown(partial))
