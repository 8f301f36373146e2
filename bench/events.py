"""Timestamped events that workers write and the harness reads back.

Every worker process appends JSON lines to ``<events_dir>/rank<R>.<pid>.jsonl``
(one writer per file, so no locking), with ``time.time()`` wall-clock stamps
that the harness compares with its own launch and kill times. The module
imports nothing heavy: a worker script can load it before torch, so that the
process-start and import phases can be told apart.

Events (``ev``): ``proc_start`` (the kernel's start time of the process),
``imported`` (torchrun-style scripts only: module imports done, process group
not yet), ``train_start`` (imports and process group done; for elastic-train's
API also the session),
``restored`` (resume state loaded), ``first_step``, ``epoch_end`` (after that
epoch's report/checkpoint), ``save`` / ``report`` (seconds they blocked) and
``done``.
"""

from __future__ import annotations

import glob
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any


def process_start_time(pid: int | str = "self") -> float:
    """Wall-clock time at which process ``pid`` was started, from /proc (10 ms resolution).

    The kernel stores the start in clock ticks since boot; the current boot
    time offset is taken from CLOCK_BOOTTIME, which uses the same origin.
    """
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = int(fields[19])  # field 22 of stat(5); fields[0] here is field 3
    since_boot = ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot)


class EventLog:
    """Appends this worker's events to its own JSON-lines file."""

    def __init__(self, events_dir: str, rank: int, restart: int):
        os.makedirs(events_dir, exist_ok=True)
        self.rank = rank
        self.restart = restart
        self.pid = os.getpid()
        self.path = os.path.join(events_dir, f"rank{rank}.{self.pid}.jsonl")
        self._first_step_seen = False

    def emit(self, ev: str, t: float | None = None, **extra: Any) -> None:
        row = {"ev": ev, "t": time.time() if t is None else t, "rank": self.rank,
               "restart": self.restart, "pid": self.pid, **extra}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")

    def process_started(self) -> None:
        """Records when the kernel started this process (call once)."""
        self.emit("proc_start", t=process_start_time())

    def step_done(self) -> None:
        """Records only the first step of this process: per-step I/O would skew steps/s."""
        if not self._first_step_seen:
            self._first_step_seen = True
            self.emit("first_step")


def restart_count(events_dir: str, rank: int) -> int:
    """Which start of the worker group this is: torch.distributed.elastic's
    ``TORCHELASTIC_RESTART_COUNT``, or (Ray Train sets none) the pid files this rank
    already wrote."""
    if "TORCHELASTIC_RESTART_COUNT" in os.environ:
        return int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if not os.path.isdir(events_dir):
        return 0
    return sum(name.startswith(f"pid.rank{rank}.restart") and not name.endswith(".tmp")
               for name in os.listdir(events_dir))


def write_pid_file(events_dir: str, rank: int, restart: int) -> None:
    """``pid.rank<R>.restart<K>``: the harness SIGKILLs a worker by this pid."""
    os.makedirs(events_dir, exist_ok=True)
    path = os.path.join(events_dir, f"pid.rank{rank}.restart{restart}")
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)


@dataclass
class Events:
    """All events of one run, as the harness reads them."""

    rows: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def read(cls, events_dir: str) -> Events:
        rows: list[dict[str, Any]] = []
        for path in glob.glob(os.path.join(events_dir, "rank*.jsonl")):
            with open(path) as f:
                for line in f:
                    if line.strip():
                        try:
                            rows.append(json.loads(line))
                        except ValueError:
                            pass  # a line cut short by SIGKILL
        rows.sort(key=lambda r: r["t"])
        return cls(rows)

    def select(self, ev: str, rank: int | None = 0, restart: int | None = 0
               ) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["ev"] == ev
                and (rank is None or r["rank"] == rank)
                and (restart is None or r["restart"] == restart)]

    def first(self, ev: str, rank: int | None = 0, restart: int | None = 0
              ) -> dict[str, Any] | None:
        rows = self.select(ev, rank, restart)
        return rows[0] if rows else None

    def time_of(self, ev: str, rank: int | None = 0, restart: int | None = 0) -> float | None:
        row = self.first(ev, rank, restart)
        return None if row is None else float(row["t"])

    def pids_by_rank(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for r in self.rows:
            if r["ev"] == "proc_start":
                out.setdefault(int(r["rank"]), []).append(int(r["pid"]))
        return out


def read_pid(events_dir: str, rank: int, restart: int) -> int | None:
    path = os.path.join(events_dir, f"pid.rank{rank}.restart{restart}")
    try:
        with open(path) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None
