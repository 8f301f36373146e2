"""The driver's live view of a run, and the feed of its callbacks.

:class:`RunMonitor` runs a background thread that prints the workers' output
(see :mod:`.console`), polls the run directory (the same ``metrics.jsonl``
that ``Result.metrics_dataframe`` reads, on any store), calls the callbacks
for each new report, and shows progress: a status line kept at the bottom of
a terminal, or a plain line at most every few seconds when stdout is a pipe
or a file (CI, logs). No dependency: a status line needs neither rich nor tqdm.

Callbacks get reports in order, and a report's checkpoint only once it is
committed (as in Ray Train, where a checkpoint is persisted before the report
is processed): a report whose checkpoint is still uploading (ASYNC) waits, and
the reports after it wait with it. A checkpoint that never became visible (its
upload was cut short; a later one is committed, or the run ended) is handed over
as None with its metrics.

Each new row also goes to the run's metric exporters, when it has any
(:class:`~elastic_train.driver.metrics_feed.MetricsFeed`), and to a
:class:`~elastic_train.stragglers.StragglerWatch`: a node
that stays slow is named in a warning on the console and handed to ``on_straggler``
(the run's record); the status line shows the latest row's slowest rank once its
score reaches the threshold. :attr:`RunMonitor.slow_here` says whether this node is the
straggler named in the run of slow reports still going on (group ranks are those of
the current round: a rendezvous starts the watch afresh).

``verbose``: 0 shows nothing, 1 (default) shows progress, 2 also shows
torch.distributed.elastic's own agent logs.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from elastic_train._internal.metric_rows import user_metrics
from elastic_train.callbacks import RunContext, UserCallback
from elastic_train.checkpoint import Checkpoint
from elastic_train.driver.console import Console, ConsoleView, LogTail
from elastic_train.driver.metrics_feed import MetricsFeed
from elastic_train.errors import WorkerFailure
from elastic_train.stragglers import Straggler, StragglerConfig, StragglerWatch

logger = logging.getLogger(__name__)


def _format(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class RunMonitor:
    """Watches one run while it trains; ``start()`` then ``stop()``.

    Example::

        monitor = RunMonitor(context, callbacks=[CSVLoggerCallback()], verbose=1)
        monitor.start()
        ...  # the agent runs; monitor.note_rendezvous / note_failure from its callbacks
        monitor.stop()
    """

    def __init__(self, context: RunContext, callbacks: list[UserCallback], log_dir: str,
                 verbose: int = 1, stream: TextIO | None = None,
                 view: ConsoleView | None = None, interval_s: float = 1.0,
                 plain_every_s: float = 10.0, nproc_per_node: int = 1,
                 stragglers: StragglerConfig | None = None,
                 on_straggler: Callable[[Straggler], None] | None = None,
                 waiting_for: str | None = None, feed: MetricsFeed | None = None):
        self.context = context
        self.callbacks = list(callbacks)
        self.verbose = verbose
        self.console = Console(stream or sys.stdout)
        self.interval_s = interval_s
        self.plain_every_s = plain_every_s
        self._group_rank, self._nodes, self._nproc = 0, 1, nproc_per_node
        self.view = view or ConsoleView()
        self.tail = LogTail(log_dir, self.console, self._prefix, self.view)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = time.monotonic()
        self._last_iteration = 0
        self._last_row: dict[str, Any] | None = None
        self._waiting: list[dict[str, Any]] = []  # rows not handed to the callbacks yet
        # Until the first rendezvous: "starting", or the server the job meets at.
        self._workers = f"waiting for {waiting_for}" if waiting_for else "starting"
        self._restarts = 0
        self._uploading = 0  # reported checkpoints not committed yet
        # The first plain line after plain_every_s; at once for a job waiting for a server,
        # which may wait long (its join timeout) where nothing answers.
        self._last_plain = time.monotonic() - (plain_every_s if waiting_for else 0.0)
        self._shown = ""
        self._straggler_config = stragglers or StragglerConfig()
        self._stragglers = StragglerWatch(self._straggler_config)
        self._on_straggler = on_straggler
        self._feed = feed

    def _prefix(self, local_rank: int) -> str:
        rank = self._group_rank * self._nproc + local_rank
        prefix = self.view.prefix(rank, local_rank)
        if prefix is not None:
            return prefix
        return f"[node{self._group_rank} rank{rank}]: " if self._nodes > 1 else f"[rank{rank}]: "

    def start(self) -> None:
        # Rows of earlier launches (a resumed run) went to the callbacks then: start after
        # them. A resume trims rows past its checkpoint; _poll_metrics notices that.
        try:
            rows = self.context.storage.read_metrics()
            self._last_iteration = int(rows[-1].get("training_iteration", 0)) if rows else 0
        except Exception:
            logger.debug("Could not read the metrics history", exc_info=True)
        self._thread = threading.Thread(target=self._loop, name="run-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Takes a last look (so no output or report is missed), runs ``after_run``."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.tail.poll(final=True)
        self._poll_metrics_safely(final=True)
        self._render(final=True)
        self.console.end_status()
        for callback in self.callbacks:
            try:
                callback.after_run(self.context)
            except Exception:
                logger.exception("Callback %r failed in after_run", callback)

    def note_rendezvous(self, group_rank: int, nodes: int) -> None:
        if (group_rank, nodes) != (self._group_rank, self._nodes):  # the rows' node numbers
            self._stragglers = StragglerWatch(self._straggler_config)  # changed meaning
        self._group_rank, self._nodes = group_rank, nodes
        self.note_recovered()

    @property
    def slow_here(self) -> Straggler | None:
        """The straggler named in the run of slow reports still going on, when it is this
        node (its group rank in the current round); else None."""
        named = self._stragglers.named
        return named if named is not None and named.node == self._group_rank else None

    def note_recovered(self) -> None:
        """The group runs again (after a rendezvous, or an in-process restart)."""
        workers = self._nodes * self._nproc
        self._workers = f"{workers} workers" + (f" on {self._nodes} nodes"
                                                if self._nodes > 1 else "")

    def note_failure(self, failures: list[WorkerFailure], restarting: bool) -> None:
        """A failed attempt; ``restarting`` unless the budget is spent (then the callbacks'
        ``after_exception`` runs)."""
        self._restarts += 1 if restarting else 0
        self._workers = "restarting" if restarting else "failed"
        if not restarting:
            exceptions = {f.rank: RuntimeError(f.traceback or f.message or f.describe())
                          for f in failures}
            for callback in self.callbacks:
                try:
                    callback.after_exception(self.context, exceptions)
                except Exception:
                    logger.exception("Callback %r failed in after_exception", callback)

    def _loop(self) -> None:
        next_poll = 0.0
        while not self._stop.wait(0.1):
            self.tail.poll()
            if time.monotonic() >= next_poll:
                next_poll = time.monotonic() + self.interval_s
                self._poll_metrics_safely()
                self._render()

    def _poll_metrics_safely(self, final: bool = False) -> None:
        try:
            self._poll_metrics()
            self._hand_over(final)
            if self._feed is not None:
                self._feed.poll(final)
        except Exception:  # an unreachable store must not stop the run or hide its error
            logger.debug("Progress poll failed", exc_info=True)

    def _poll_metrics(self) -> None:
        rows = self.context.storage.read_metrics()
        # Commits come in order and at most two checkpoints are in flight (ASYNC): count
        # the reported ones after the newest committed one.
        self._uploading = 0
        for row in reversed(rows[-3:]):
            name = row.get("checkpoint_dir_name")
            if name and self.context.storage.checkpoints.is_committed(name):
                break
            self._uploading += bool(name)
        if rows and rows[-1].get("training_iteration", 0) < self._last_iteration:
            self._last_iteration = rows[-1]["training_iteration"]  # history trimmed on resume
            self._waiting = [r for r in self._waiting  # the failed attempt's, redone
                             if r.get("training_iteration", 0) <= self._last_iteration]
        for row in rows:
            iteration = row.get("training_iteration", 0)
            if iteration <= self._last_iteration:
                continue
            self._last_iteration = iteration
            self._last_row = row
            self._waiting.append(row)
            self._watch_stragglers(row)
            if self._feed is not None:
                self._feed.observe(row)

    def _watch_stragglers(self, row: dict[str, Any]) -> None:
        straggler = self._stragglers.observe(row)
        if straggler is None:
            return
        logger.warning("Straggler: %s.", straggler.describe())
        if self.verbose:
            self.console.lines([f"[elastic-train] straggler: {straggler.describe()}"])
        if self._on_straggler is not None:
            self._on_straggler(straggler)

    def _hand_over(self, final: bool) -> None:
        """Calls ``after_report`` for the waiting rows, in order, each once its checkpoint
        is committed (or, as None, once it never will be: see the module)."""
        checkpoints = self.context.storage.checkpoints
        while self._waiting:
            row = self._waiting[0]
            name = row.get("checkpoint_dir_name")
            checkpoint = None
            if name and checkpoints.is_committed(name):
                checkpoint = Checkpoint(f"{self.context.storage.run_path}/{name}",
                                        self.context.storage.fs)
            elif name and not final and not any(
                    later.get("checkpoint_dir_name") and checkpoints.is_committed(
                        later["checkpoint_dir_name"]) for later in self._waiting[1:]):
                return  # still uploading
            self._waiting.pop(0)
            for callback in self.callbacks:
                try:
                    callback.after_report(self.context, [row], checkpoint)
                except Exception:
                    logger.exception("Callback %r failed in after_report", callback)

    def status_line(self) -> str:
        elapsed = time.monotonic() - self._started
        parts = [f"[elastic-train] {self.context.run_name}", f"{elapsed:.0f}s", self._workers]
        if self._last_row:
            parts.append(f"iter {self._last_row.get('training_iteration')}")
            parts += [f"{k} {_format(v)}" for k, v in user_metrics(self._last_row).items()
                      if isinstance(v, (int, float, str))][:4]
            score = self._last_row.get("slowest_rank_score")
            if score is not None and score >= self._straggler_config.score_threshold:
                parts.append(f"slowest rank {self._last_row['slowest_rank']} {score:.1f}x")
            if self._last_row.get("checkpoint_dir_name"):
                parts.append(f"ckpt {self._last_row['checkpoint_dir_name']}")
        if self._uploading:
            parts.append(f"uploading {self._uploading}")
        if self._restarts:
            parts.append(f"restarts {self._restarts}")
        return " | ".join(parts)

    def _render(self, final: bool = False) -> None:
        if not self.verbose:
            return
        line = self.status_line()
        if self.console.tty:
            self.console.status(line)
        elif line != self._shown and (final or time.monotonic() - self._last_plain
                                      >= self.plain_every_s):
            self.console.lines([line])
            self._last_plain = time.monotonic()
            self._shown = line
