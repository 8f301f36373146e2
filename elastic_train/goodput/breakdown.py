"""Where a run's time goes: its goodput ledger read into wall time by cause.

The ledger is the run directory's ``goodput/``: append-only JSON lines, one file per
writer (:mod:`elastic_train.storage.ledger_file`), each line an event stamped ``t``
(seconds since the epoch) by the process that knew it:

- the driver that records the run: ``launch``, ``fault`` (``failed_at``: when the
  first worker failed; ``t``: when its agent knew; ``kind``), ``join`` (a node waits
  to join the running job, so the group forms again though nothing failed),
  ``rendezvous`` (the group formed again), ``end`` (the launch's outcome);
- rank 0 of each attempt: ``attempt`` (``started``: the session began, ``t``: the
  ranks agreed where to resume, ``restored_iteration``: from which iteration, None on
  a fresh start; ``world_size``: the attempt's, for the run's picture), ``live`` (the
  attempt went on from a survivor's memory instead, :class:`elastic_train.torch.LiveState`:
  from report ``iteration``, at ``step``, a copy taken at ``taken_at``) and ``work``
  (what rank 0 measured since its previous ``work``, by cause, between iterations
  ``from_iteration`` and ``iteration``; written at checkpoint reports, every
  :data:`FLUSH_S` at a report, and at the attempt's end).

:func:`breakdown` is the one reader: every consumer (``elastic-train show``,
``Result.goodput``, the console's last line, a metrics exporter) asks it. It puts the
events of each launch in time order and gives every second between two of them to
the cause the earlier one starts: a launch or a rendezvous starts start-up, a fault
detection, its detection or a join a rendezvous, an attempt's start a restore (or
start-up on a fresh start). Between rank 0's ``work`` lines the seconds are the causes
rank 0 measured (the rest of the gap: other); from its last line to a fault or a
join, work that is lost (recompute) -- but for a live recovery's, whose work up to the
copy it went on from was kept (productive) --, and so is every productive second of an
earlier attempt past the iteration the next attempt restored; whatever comes before a launch's
end is its shutdown. So the causes add up to the wall time of the launches by
construction, and ``other`` says how much no writer accounted for.

Example::

    goodput = breakdown(storage.read_ledger())
    print(f"{goodput.ettr:.1%}", goodput.seconds[Cause.RECOMPUTE])
"""

from __future__ import annotations

import bisect
import enum
import heapq
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

FLUSH_S = 10.0  # rank 0 writes its measured work at a report at least this often


class Cause(str, enum.Enum):
    """Where a second of the run's wall time went; the value names it in JSON."""

    PRODUCTIVE = "productive"      # training steps whose result was kept
    STARTUP = "startup"            # a launch or a restart to the train function's session
    DETECTION = "detection"        # a worker failed -> its agent knew
    RENDEZVOUS = "rendezvous"      # the agent knew -> the group formed again
    RESTORE = "restore"            # session start -> the ranks agreed on the checkpoint
    RECOMPUTE = "recompute"        # work past the last committed checkpoint, lost
    CHECKPOINT = "checkpoint"      # training waited on a save (and the user's own save)
    PREEMPTION = "preemption"      # a preempted node's fault -> the group formed again
    STRAGGLERS = "stragglers"      # rank 0 waited in report() for slower ranks
    SHUTDOWN = "shutdown"          # rank 0's last line -> the launch's end (processes exit)
    OTHER = "other"                # accounted by no writer (bookkeeping, the ledger's writes)


@dataclass(frozen=True)
class AttemptTime:
    """One attempt's seconds by cause: from its launch or fault to the next fault or end."""

    seconds: dict[Cause, float]

    @property
    def wall_s(self) -> float:
        return sum(self.seconds.values())


@dataclass(frozen=True)
class Goodput:
    """A run's wall time split by cause, per attempt and in total, read from its ledger.

    Attributes:
        wall_s: The wall time of every launch of the run (a driver that died: up to
            its last ledger line).
        seconds: Seconds by cause; they add up to ``wall_s``.
        attempts: The same per attempt, in order.
        failures: The faults the ledger recorded.
        checkpoints: The checkpoints rank 0 reported.
        live_recoveries: The attempts that went on from a survivor's memory
            (:class:`elastic_train.torch.LiveState`), not from a checkpoint.

    Example::

        result = trainer.fit()
        print(f"ETTR {result.goodput.ettr:.1%}, "
              f"recompute {result.goodput.share(Cause.RECOMPUTE):.1%}")
    """

    wall_s: float
    seconds: dict[Cause, float]
    attempts: tuple[AttemptTime, ...] = ()
    failures: int = 0
    checkpoints: int = 0
    live_recoveries: int = 0

    @property
    def ettr(self) -> float | None:
        """Effective training time ratio: productive seconds over wall seconds."""
        return self.seconds[Cause.PRODUCTIVE] / self.wall_s if self.wall_s > 0 else None

    def share(self, cause: Cause) -> float:
        """``cause``'s part of the wall time (0 for an empty ledger)."""
        return self.seconds[cause] / self.wall_s if self.wall_s > 0 else 0.0

    def describe(self) -> str:
        """One line: ETTR and every cause that took time, largest first."""
        badput = sorted(((s, c) for c, s in self.seconds.items()
                         if c is not Cause.PRODUCTIVE and s >= 0.05), reverse=True)
        causes = ", ".join(f"{c.value} {s:.1f} s" for s, c in badput)
        live = (f"; {self.live_recoveries} of {self.failures} recoveries live (from memory)"
                if self.live_recoveries else "")
        return (f"ETTR {self.ettr or 0.0:.1%}: {self.seconds[Cause.PRODUCTIVE]:.1f} s "
                f"productive of {self.wall_s:.1f} s" + (f"; {causes}" if causes else "") + live)

    def to_json(self) -> dict[str, Any]:
        return {"ettr": self.ettr, "wall_s": self.wall_s, "failures": self.failures,
                "checkpoints": self.checkpoints, "live_recoveries": self.live_recoveries,
                "seconds": {c.value: s for c, s in self.seconds.items()},
                "shares": {c.value: self.share(c) for c in Cause},
                "attempts": [{c.value: s for c, s in a.seconds.items()}
                             for a in self.attempts]}


# The causes a work line measures, with their keys (read once per line: enums are slow).
_MEASURED = tuple((c, c.value) for c in (Cause.PRODUCTIVE, Cause.CHECKPOINT, Cause.STRAGGLERS))


def _zero() -> dict[Cause, float]:
    return dict.fromkeys(Cause, 0.0)


@dataclass
class _Work:
    """A ``work`` line's productive seconds not yet found lost."""

    attempt: dict[Cause, float]
    from_iteration: int
    iteration: int
    productive: float


@dataclass
class _Tally:
    """The running sums of :func:`breakdown`. ``live`` holds the work lines whose
    productive seconds a later restore could still find lost, as a heap on their last
    iteration (highest first): a restore visits only the lines past its iteration, so
    reading a ledger takes time linear in its lines, however many faults it holds."""

    attempts: list[dict[Cause, float]] = field(default_factory=list)
    live: list[tuple[int, int, _Work]] = field(default_factory=list)
    _order: itertools.count = field(default_factory=itertools.count)
    wall_s: float = 0.0
    failures: int = 0
    checkpoints: int = 0

    def add(self, cause: Cause, seconds: float) -> None:
        self.attempts[-1][cause] += seconds

    def work(self, entry: dict[str, Any], gap: float) -> None:
        """A ``work`` line: rank 0's measured causes, the rest of its ``gap`` other."""
        attempt, measured = self.attempts[-1], 0.0
        for cause, key in _MEASURED:
            seconds = float(entry.get(key, 0.0))
            attempt[cause] += seconds
            measured += seconds
        attempt[Cause.OTHER] += gap - measured
        self.checkpoints += int(entry.get("checkpoints", 0))
        self._keep(_Work(attempt, int(entry.get("from_iteration", 0)),
                         int(entry.get("iteration", 0)), float(entry.get("productive", 0.0))))

    def _keep(self, work: _Work) -> None:
        """Adds ``work`` to :attr:`live` (a line with no productive seconds has none to lose)."""
        if work.productive > 0:
            heapq.heappush(self.live, (-work.iteration, next(self._order), work))

    def restored(self, iteration: int) -> None:
        """Productive seconds past ``iteration`` were lost: recompute, in their attempt."""
        trimmed = []
        while self.live and -self.live[0][0] > iteration:
            work = heapq.heappop(self.live)[2]
            span = work.iteration - work.from_iteration
            lost = work.productive * (
                (work.iteration - max(iteration, work.from_iteration)) / span if span > 0 else 1)
            work.attempt[Cause.PRODUCTIVE] -= lost
            work.attempt[Cause.RECOMPUTE] += lost
            work.productive -= lost
            work.iteration = max(iteration, work.from_iteration)
            trimmed.append(work)
        for work in trimmed:
            self._keep(work)


# The cause of the seconds after a point, until the next; None: rank 0 measured them.
_AFTER = {"launch": Cause.STARTUP, "failed": Cause.DETECTION, "fault": Cause.RENDEZVOUS,
          "join": Cause.RENDEZVOUS, "rendezvous": Cause.STARTUP, "started": Cause.STARTUP,
          "resumed": Cause.RESTORE, "attempt": None, "work": None, "held": None}


_ATTEMPT_ENDS = ("failed", "join")  # points that end an attempt before the launch's end


def _failed_at(entry: dict[str, Any], rank0_times: list[float]) -> float:
    """When a fault's worker failed: its ``failed_at``, but never before rank 0's last
    line ahead of the detection (``rank0_times``: its lines' times, sorted). A report is
    collective, so rank 0 cannot have finished one after a peer died; and torch stamps a
    worker killed by a signal to the whole second, which can fall before lines rank 0
    wrote in that second."""
    t = float(entry.get("t", 0.0))
    written = _latest(rank0_times, t)
    written = 0.0 if written is None else written
    return min(max(float(entry.get("failed_at", t)), written), t)


def _latest(times: list[float], t: float, strictly: bool = False) -> float | None:
    """The latest of the sorted ``times`` at ``t`` or before (before it: ``strictly``);
    None: none is. A bisection: no reader scans every line for every fault."""
    found = (bisect.bisect_left if strictly else bisect.bisect_right)(times, t)
    return times[found - 1] if found else None


def _live_resumes(entries: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[float]]:
    """``entries`` with each attempt that went on from a live state resumed at the live
    state's iteration (rank 0 writes ``live`` after its ``attempt``), and for each such
    attempt the time up to which the failed attempt's unwritten work was kept: from rank
    0's last line before the fault to the copy (or the fault, if the copy's clock, on
    another node, says later)."""
    ordered = sorted(entries, key=lambda e: float(e.get("t", 0.0)))
    rank0 = [float(e.get("t", 0.0)) for e in ordered if e.get("event") in ("attempt", "work")]
    faults = sorted(float(e.get("failed_at", e.get("t", 0.0))) for e in ordered
                    if e.get("event") == "fault")
    attempt: dict[str, Any] | None = None
    out, kept_until = [], []
    for entry in ordered:
        event = entry.get("event")
        if event == "attempt":
            attempt = dict(entry)
            out.append(attempt)
            continue
        out.append(entry)
        if event != "live" or attempt is None:
            continue
        attempt["restored_iteration"] = int(entry.get("iteration", 0))
        began = float(attempt.get("t", 0.0))
        last, fault = _latest(rank0, began, strictly=True), _latest(faults, began)
        taken = float(entry.get("taken_at", 0.0))
        if last is not None and fault is not None and last < min(taken, fault):
            kept_until.append(min(taken, fault))
    return out, kept_until


def _points(entries: Iterable[dict[str, Any]]) -> list[tuple[float, str, dict[str, Any]]]:
    """Every event as (time, kind, entry) in time order; a fault is two points (its
    failure and its detection), an attempt two (its start and its agreement)."""
    entries, copies = _live_resumes(list(entries))
    rank0_times = sorted(float(e.get("t", 0.0)) for e in entries
                         if e.get("event") in ("attempt", "work"))
    points = [(t, "held", {}) for t in copies]
    for entry in entries:
        event, t = entry.get("event"), float(entry.get("t", 0.0))
        if event == "fault":
            points.append((_failed_at(entry, rank0_times), "failed", entry))
        elif event == "attempt":
            resumed = entry.get("restored_iteration") is not None
            points.append((min(float(entry.get("started", t)), t),
                           "resumed" if resumed else "started", entry))
        if event in _AFTER or event == "end":
            points.append((t, event, entry))
    # at equal times, in the order things happen: rank 0's lines before the fault or join
    return sorted(points, key=lambda p: (p[0], p[1] in _ATTEMPT_ENDS))


def breakdown(entries: Iterable[dict[str, Any]]) -> Goodput:
    """The run's wall time by cause, from its ledger lines (any order, any writer)."""
    entries = list(entries)
    tally = _Tally()
    previous: tuple[float, str, dict[str, Any]] | None = None
    preempted = False
    for point in _points(entries):
        t, kind, entry = point
        if kind == "launch":
            tally.attempts.append(_zero())
        elif previous is None or previous[1] == "end":
            continue  # before any launch, or after a launch ended: not the run's time
        else:
            gap = t - previous[0]
            tally.wall_s += gap
            after = _AFTER[previous[1]]
            if kind == "end":  # the train function's end, or the run's last fault's
                tally.add(Cause.SHUTDOWN, gap)
            elif kind == "work" and after is None:
                tally.work(entry, gap)
            elif after is None:  # rank 0's unwritten work: lost at a fault or join, kept up
                # to a live copy, else other
                tally.add(Cause.RECOMPUTE if kind in _ATTEMPT_ENDS
                          else Cause.PRODUCTIVE if kind == "held" else Cause.OTHER, gap)
            else:
                tally.add(Cause.PREEMPTION if preempted and after in (
                    Cause.DETECTION, Cause.RENDEZVOUS) else after, gap)
            if kind in _ATTEMPT_ENDS:
                tally.failures += int(kind == "failed")
                tally.attempts.append(_zero())
                preempted = entry.get("kind") == "preemption"
            elif kind == "resumed":
                tally.restored(int(entry["restored_iteration"]))
        previous = point
    seconds = _zero()
    for attempt in tally.attempts:
        for cause, value in attempt.items():
            seconds[cause] += value
    return Goodput(tally.wall_s, seconds, tuple(AttemptTime(a) for a in tally.attempts),
                   tally.failures, tally.checkpoints,
                   sum(e.get("event") == "live" for e in entries))
