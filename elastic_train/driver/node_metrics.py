"""The run's figures as metrics: one table of names, fed by the node's driver, read by
the exporters (:mod:`.prometheus_endpoint`, :mod:`.otlp_push`).

Which process: each node's driver. It is where the figures are known -- the agent runs
in it (restarts by cause, rendezvous rounds, world size, recovery: :class:`AgentEvents`),
its run monitor reads the run's ``metrics.jsonl`` (step time, slowest-rank score) and
sees checkpoints commit (upload lag and bytes), and it can read the goodput ledger
(goodput and badput by cause) -- so one endpoint per node, the usual shape for a
Prometheus target, with no new process and nothing added to a worker's step. (The
workers' own figures already reach the driver through the report rows.) Every node's
driver reads the same rows, so run-wide figures (step time, goodput) are the same on
each node; a dashboard takes ``max by (run)`` of them.

Names follow Prometheus's conventions: ``elastic_train_`` first, base units in the
name (``_seconds``, ``_bytes``), counters end in ``_total`` as exposed, and every
series carries ``node`` (the node's address or host name) and ``run`` (the run's name)
and at most one more label of a few values (``cause``). OpenTelemetry gets the same
names (without ``_total``, which its Prometheus conversion adds) and attributes.

Example::

    metrics = NodeMetrics("digits", "node-a", [PrometheusSink(registry)])
    metrics.note_rendezvous(world_size=8)
    metrics.note_row({"step_time_s": 0.21, "slowest_rank_score": 1.1})
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

from elastic_train.errors import ConfigError
from elastic_train.integrations import extras

logger = logging.getLogger(__name__)


class Kind(str, enum.Enum):
    COUNTER = "counter"      # only goes up: the value recorded is added
    GAUGE = "gauge"          # the value recorded is the value now
    HISTOGRAM = "histogram"  # the value recorded is one observation


@dataclass(frozen=True)
class Metric:
    """One exported figure: its base name (a counter's ``_total`` is added by Prometheus's
    exposition), kind, help text, and labels beyond ``node`` and ``run``."""

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()


COMMON_LABELS = ("node", "run")
# Recovery and rendezvous take from under a second (in-process restarts) to minutes.
BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

RESTARTS = Metric("elastic_train_restarts", Kind.COUNTER,
                  "Restarts of the worker group, by the budget the failure spent "
                  "(failure, peer, preemption).", ("cause",))
RECOVERY = Metric("elastic_train_recovery_seconds", Kind.HISTOGRAM,
                  "From a worker's failure to its group running again.")
RENDEZVOUS_ROUNDS = Metric("elastic_train_rendezvous_rounds", Kind.COUNTER,
                           "Rendezvous rounds this node completed.")
RENDEZVOUS = Metric("elastic_train_rendezvous_seconds", Kind.HISTOGRAM,
                    "From the agent asking for a round (its start, or a failed attempt's "
                    "stop) to the group formed.")
WORLD_SIZE = Metric("elastic_train_world_size", Kind.GAUGE,
                    "Workers in the job's current round.")
STEP_TIME = Metric("elastic_train_step_time_seconds", Kind.GAUGE,
                   "The ranks' median step time at the latest report.")
SLOWEST_SCORE = Metric("elastic_train_slowest_rank_score", Kind.GAUGE,
                       "The slowest rank's step time over the median, latest report.")
CHECKPOINT_BLOCKED = Metric("elastic_train_checkpoint_blocked_seconds", Kind.GAUGE,
                            "Seconds training waited on checkpoint saves, whole run "
                            "(goodput ledger).")
UPLOAD_LAG = Metric("elastic_train_upload_lag_seconds", Kind.GAUGE,
                    "From the report of the latest committed checkpoint to its commit.")
UPLOAD_BYTES = Metric("elastic_train_upload_bytes", Kind.COUNTER,
                      "Bytes of the checkpoints committed while this driver ran.")
GOODPUT = Metric("elastic_train_goodput_seconds", Kind.GAUGE,
                 "Productive seconds of the whole run (goodput ledger).")
BADPUT = Metric("elastic_train_badput_seconds", Kind.GAUGE,
                "Seconds of the whole run lost, by cause (goodput ledger).", ("cause",))
LIVE_RECOVERIES = Metric("elastic_train_live_recoveries", Kind.GAUGE,
                         "Recoveries that went on from a survivor's memory (LiveState), "
                         "not from a checkpoint, whole run (goodput ledger).")

METRICS: tuple[Metric, ...] = (
    RESTARTS, RECOVERY, RENDEZVOUS_ROUNDS, RENDEZVOUS, WORLD_SIZE, STEP_TIME, SLOWEST_SCORE,
    CHECKPOINT_BLOCKED, UPLOAD_LAG, UPLOAD_BYTES, GOODPUT, BADPUT, LIVE_RECOVERIES)


def require(module: str, extra: str, field: str, package: str | None = None) -> ModuleType:
    """Imports an exporter's client ``module``, or raises ConfigError (before any process
    starts) naming the ``package``, the extra that installs it and the ``MetricsConfig``
    field to drop."""
    try:
        return extras.require(module, extra, f"MetricsConfig.{field}", package)
    except ImportError as exc:
        raise ConfigError(f"{exc} Or drop MetricsConfig.{field}.",
                          field=f"MetricsConfig.{field}") from exc


class Sink(Protocol):
    """An exporter's side: takes each recorded value (see :class:`Kind`)."""

    def record(self, metric: Metric, value: float, labels: dict[str, str]) -> None: ...

    def close(self) -> None: ...


class NodeMetrics:
    """This node's figures, recorded into every sink as they become known.

    The ``note_*`` methods are called from the agent's events (the agent's thread) and
    the run monitor's thread; each records a few values, so a report costs the training
    nothing (the workers never call here). A sink that raises is logged once and
    dropped, so metrics never stop a run.
    """

    def __init__(self, run: str, node: str, sinks: Sequence[Sink],
                 clock: Callable[[], float] = time.time):
        self.common = {"node": node, "run": run}
        self.sinks = list(sinks)
        self.clock = clock
        self._asked_at: float | None = clock()  # when the agent asked for a round
        self._failed_at: float | None = None    # the earliest failure not recovered yet

    def _record(self, metric: Metric, value: float, **labels: str) -> None:
        for sink in list(self.sinks):
            try:
                sink.record(metric, value, {**self.common, **labels})
            except Exception:  # noqa: BLE001 -- an exporter's fault must not stop the run
                logger.warning("Metrics: %s failed on %s and is turned off for this run.",
                               type(sink).__name__, metric.name, exc_info=True)
                self.sinks.remove(sink)

    def note_rendezvous(self, world_size: int) -> None:
        """A round formed with ``world_size`` workers."""
        now = self.clock()
        self._record(RENDEZVOUS_ROUNDS, 1)
        if self._asked_at is not None:
            self._record(RENDEZVOUS, max(0.0, now - self._asked_at))
            self._asked_at = None
        self._record(WORLD_SIZE, world_size)
        self.note_recovered()

    def note_failure(self, cause: str, restarting: bool, failed_at: float | None) -> None:
        """A failed attempt: ``cause`` is the budget it spent (a
        :class:`~elastic_train._internal.failure_kinds.FailureKind` value); ``failed_at`` when the
        first worker failed (seconds since the epoch; None: now)."""
        if not restarting:
            return
        now = self.clock()
        self._record(RESTARTS, 1, cause=cause)
        self._asked_at = now
        if self._failed_at is None:
            self._failed_at = failed_at if failed_at else now

    def note_recovered(self) -> None:
        """The group runs again (after a rendezvous or an in-process restart)."""
        self._asked_at = None
        if self._failed_at is not None:
            self._record(RECOVERY, max(0.0, self.clock() - self._failed_at))
            self._failed_at = None

    def note_row(self, row: dict[str, Any]) -> None:
        """A new report's row (``metrics.jsonl``): its step time and straggler score."""
        for metric, key in ((STEP_TIME, "step_time_s"), (SLOWEST_SCORE, "slowest_rank_score")):
            value = row.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self._record(metric, float(value))

    def note_commit(self, lag_s: float, size_bytes: int) -> None:
        """A checkpoint became committed ``lag_s`` after its report, ``size_bytes`` big."""
        self._record(UPLOAD_LAG, max(0.0, lag_s))
        self._record(UPLOAD_BYTES, size_bytes)

    def note_goodput(self, seconds: dict[str, float], live_recoveries: int = 0) -> None:
        """The ledger's breakdown: seconds by cause (``productive`` and the badput causes),
        and the recoveries that went on from a survivor's memory."""
        self._record(LIVE_RECOVERIES, live_recoveries)
        for cause, value in seconds.items():
            if cause == "productive":
                self._record(GOODPUT, value)
            else:
                self._record(BADPUT, value, cause=cause)
            if cause == "checkpoint":
                self._record(CHECKPOINT_BLOCKED, value)

    def close(self) -> None:
        """Ends every sink (the OTLP push sends its last values)."""
        for sink in self.sinks:
            try:
                sink.close()
            except Exception:  # noqa: BLE001 -- as in _record
                logger.warning("Metrics: %s failed to close.", type(sink).__name__,
                               exc_info=True)
