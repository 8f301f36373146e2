"""This attempt's time, report by report: what rank 0 writes to the goodput ledger, and
what ``elastic_train.should_checkpoint()`` answers on every rank.

Every rank times its reports alike; only rank 0 writes (:mod:`elastic_train.goodput.breakdown`
says what the lines mean). Between two reports a rank's time is productive; in a
report, the first collective is a wait for the slower ranks (stragglers), the rest a
wait on the checkpoint when the report carries one (else productive: the report's
own small cost). When ``should_checkpoint()`` said yes before a checkpoint report,
the time from that answer to the report is the user's own save: checkpoint time too.
Rank 0 writes what it measured at checkpoint reports (the boundaries a restore goes
back to), every :data:`~elastic_train.goodput.FLUSH_S` at a report and at the
attempt's end: a few lines a minute at most, never one per step. The lines are
written from a thread of their own (:class:`~elastic_train.storage.ledger_file.QueuedLedger`),
which the attempt's end waits for, up to :data:`FLUSH_WAIT_S`.

``should_checkpoint()`` must answer alike on every rank without a collective of its
own, so it reads only values every rank holds alike: the run's history, broadcast by
rank 0 when the ranks join (:class:`RunHistory`), and what each report's first
collective already carries (:meth:`AttemptClock.shared_numbers`, one column per
rank: rank 0's times since the last checkpoint and the last report, and the slowest
rank's latest save cost).

Example::

    clock = AttemptClock(history, iteration=0, ledger=storage.ledger_file("rank0"))
    clock.ready(started_at, restored_iteration=None)
    numbers = clock.shared_numbers()      # into report()'s first collective
    clock.waited()                        # the first collective returned
    clock.report_ends(columns, any_checkpoint=True, iteration=1)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from elastic_train.errors import StorageError
from elastic_train.goodput import interval as checkpoint_interval
from elastic_train.goodput.breakdown import FLUSH_S, Cause, Goodput, breakdown
from elastic_train.storage import RunStorage
from elastic_train.storage.ledger_file import LedgerFile, QueuedLedger

logger = logging.getLogger(__name__)

SHARED = 3  # the numbers shared_numbers() adds to a report's first collective
FLUSH_WAIT_S = 5.0  # what an attempt's end waits at most for its ledger lines


@dataclass(frozen=True)
class RunHistory:
    """What the run's ledger said when an attempt began, alike on every rank: the wall
    time seen, the failures in it, and the mean save cost (None before any checkpoint)."""

    observed_s: float = 0.0
    failures: int = 0
    save_cost_s: float | None = None

    @classmethod
    def of(cls, goodput: Goodput) -> RunHistory:
        cost = (goodput.seconds[Cause.CHECKPOINT] / goodput.checkpoints
                if goodput.checkpoints else None)
        return cls(goodput.wall_s, goodput.failures, cost)

    @classmethod
    def read(cls, storage: RunStorage) -> RunHistory:
        """The run's history from its ledger (empty, with a warning, when unreadable)."""
        try:
            return cls.of(breakdown(storage.read_ledger()))
        except StorageError as exc:
            logger.warning("Could not read the goodput ledger (%s): should_checkpoint() "
                           "starts without the run's history.", exc)
            return cls()


@dataclass
class _Sums:
    """Rank 0's seconds by cause since its last ledger line."""

    seconds: dict[Cause, float] = field(default_factory=lambda: dict.fromkeys(
        (Cause.PRODUCTIVE, Cause.CHECKPOINT, Cause.STRAGGLERS), 0.0))
    checkpoints: int = 0


class AttemptClock:
    """One attempt's report timing on one rank (see the module's docstring)."""

    def __init__(self, history: RunHistory, iteration: int, ledger: LedgerFile | None = None,
                 monotonic: Callable[[], float] = time.monotonic):
        self.history = history
        # written off the caller's thread: a slow store never holds training
        self._ledger = QueuedLedger(ledger) if ledger is not None else None
        self._now = monotonic  # (a test's own clock)
        self._iteration = iteration  # at the last ledger line
        self._sums = _Sums()
        self._flushed = self._last_end = self._checkpoint_end = self._now()
        self._entry = self._round = 0.0
        self._asked: float | None = None  # when should_checkpoint() last said yes
        self._save_s = 0.0  # this rank's latest save cost (0: none yet)
        # alike on every rank: from the reports' shared numbers
        self._since_checkpoint_s = 0.0
        self._interval_s: float | None = None
        self._save_cost_s = history.save_cost_s

    def ready(self, started: float, restored_iteration: int | None,
              world_size: int | None = None) -> None:
        """The ranks agreed where to resume (``restored_iteration``; None: a fresh start);
        the session began at ``started`` (wall clock); ``world_size``: the attempt's."""
        self._flushed = self._last_end = self._checkpoint_end = self._now()
        self._write({"event": "attempt", "started": started,
                     "restored_iteration": restored_iteration, "world_size": world_size})

    def live_restored(self, iteration: int, step: int, source: int, taken_at: float) -> None:
        """The ranks went on from a live state instead (see
        :class:`elastic_train.torch.LiveState`): its ``step`` and report ``iteration``, the
        rank it came from, and when it was taken (work before that was kept)."""
        self._iteration = iteration
        self._write({"event": "live", "iteration": iteration, "step": step,
                     "source_rank": source, "taken_at": taken_at})

    def should_checkpoint(self, prior_mtbf_s: float) -> bool:
        """Young/Daly's answer from shared values
        (see :func:`elastic_train.goodput.interval.is_due`)."""
        history = self.history
        mtbf = checkpoint_interval.mtbf(history.observed_s, history.failures, prior_mtbf_s)
        due = checkpoint_interval.is_due(self._since_checkpoint_s, self._interval_s,
                                         self._save_cost_s, mtbf)
        if due:
            self._asked = self._now()
        return due

    def shared_numbers(self) -> tuple[float, float, float]:
        """A report begins: this rank's training seconds since its last checkpoint report
        and since its last report (the user's save after a True left out), and its latest
        save cost, for the report's first collective."""
        self._entry = self._now()
        save = self._user_save()
        return (self._entry - self._checkpoint_end - save, self._entry - self._last_end - save,
                self._save_s)

    def _user_save(self) -> float:
        """The time from should_checkpoint()'s True to this report (0 without one)."""
        asked = self._asked
        return self._entry - asked if asked is not None and asked >= self._last_end else 0.0

    def waited(self) -> None:
        """The report's first collective returned (the wait for slower ranks ends)."""
        self._round = self._now()

    def report_ends(self, columns: list[list[float]], any_checkpoint: bool,
                    iteration: int) -> None:
        """The report returned; ``columns``: the shared numbers of every rank, one list
        per number; ``iteration``: the report's."""
        now, sums = self._now(), self._sums.seconds
        own = self._entry - self._last_end
        save = self._user_save() if any_checkpoint else 0.0
        if any_checkpoint:
            self._save_s = save + now - self._round
            self._sums.checkpoints += 1
            self._checkpoint_end = now
        sums[Cause.PRODUCTIVE] += own - save + (0.0 if any_checkpoint else now - self._round)
        sums[Cause.CHECKPOINT] += save + (now - self._round if any_checkpoint else 0.0)
        sums[Cause.STRAGGLERS] += self._round - self._entry
        since, interval, saves = columns
        self._since_checkpoint_s = 0.0 if any_checkpoint else since[0]
        self._interval_s = interval[0]
        if max(saves) > 0:
            self._save_cost_s = max(saves)
        self._asked = None
        if any_checkpoint or now - self._flushed >= FLUSH_S:
            self._flush(iteration)
        self._last_end = self._now()  # a flush's own time is the ledger's "other"

    def finish(self, waited_s: float, iteration: int) -> None:
        """The attempt ends: rank 0's last line, with ``waited_s`` spent on the uploads
        still in flight."""
        self._sums.seconds[Cause.PRODUCTIVE] += self._now() - waited_s - self._last_end
        self._sums.seconds[Cause.CHECKPOINT] += waited_s
        self._flush(iteration)
        self.close()

    def close(self) -> None:
        """The attempt ended (finished or failed): its ledger lines are written, within a
        bound, and the ledger's thread ends."""
        if self._ledger is not None and not self._ledger.close(FLUSH_WAIT_S):
            logger.warning("The goodput ledger's last lines were not written within %.0f s "
                           "of the attempt's end: `elastic-train show` may miss them.",
                           FLUSH_WAIT_S)

    def _flush(self, iteration: int) -> None:
        sums = self._sums
        self._write({"event": "work", "from_iteration": self._iteration, "iteration": iteration,
                     **{c.value: s for c, s in sums.seconds.items()},
                     "checkpoints": sums.checkpoints})
        self._sums, self._iteration, self._flushed = _Sums(), iteration, self._now()

    def _write(self, entry: dict) -> None:
        if self._ledger is not None:
            self._ledger.append({**entry, "t": time.time()})
