"""Straggler scores: how much slower each rank and node steps than the job's median.

The rule, pure (no process, no clock): each report carries every rank's step time
(:mod:`elastic_train.worker.step_times` measures it); a rank's *score* is its step
time over the job's median (the lower median, so that in a job of two the slower
rank is measured against the other, not against their mean). A node's score is its
slowest rank's. :func:`step_fields` puts the median and the slowest rank and node in
the report's metric row; :class:`StragglerWatch` reads those rows and names a node
once it was the slowest, with a score at or above ``StragglerConfig.score_threshold``
and at least ``min_excess_s`` slower than the median, in ``window`` reports in a row.

With ``StragglerConfig(replace=True)`` a named node is also replaced, when the job has
spares (``ScalingConfig.spare_nodes``): every node's driver reads the same rows, so the
named node knows it is the slow one (:attr:`StragglerWatch.named`, while its run of
slow reports lasts); its agent leaves the job once a spare actually waits
(:mod:`elastic_train.agent.leave_for_spare`), is kept out for ``cool_off_s`` like a node
a health check sent away (:mod:`elastic_train._internal.departures`), and the spare takes its
ranks at the next rendezvous. Without a waiting spare it stays, and says so once.

Example::

    fields = step_fields([0.10, 0.11, 0.31], nodes=[0, 0, 1])
    # {"step_time_s": 0.11, "slowest_rank": 2, "slowest_rank_score": 2.82, "slowest_node": 1}
    watch = StragglerWatch(StragglerConfig(window=1))
    watch.observe({**fields, "training_iteration": 7})  # Straggler(node=1, rank=2, ...)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from elastic_train.errors import ConfigError


@dataclass(frozen=True)
class StragglerConfig:
    """When a slow node is named a straggler (our addition; Ray Train has none).

    Args:
        score_threshold: A report counts against a node when its slowest rank's step
            time is at least this many times the job's median (default 1.5).
        window: How many reports in a row must count against the same node before it
            is named (default 5), so that one slow step (a checkpoint, a GC pause) is
            not.
        min_excess_s: And by at least this many seconds per step (default 0.05), so that
            millisecond steps, whose ratios are mostly noise, name nobody.
        replace: Also replace the named node with a spare (default False): it leaves
            the job once a spare waits, and the spare takes its ranks. Needs spares
            (``ScalingConfig(spare_nodes=N)``, ``launch --spares N``), checked before
            anything starts; without a waiting spare the node stays.
        cool_off_s: How long a node replaced as a straggler is not admitted again
            (default 600 s), so that the cluster does not bring it straight back; its
            departure is recorded in ``run.json`` with it (0: admitted again at once,
            and recorded nowhere but in its own error, as any departure without a
            cooling-off period).

    Example::

        RunConfig(straggler_config=StragglerConfig(score_threshold=2.0, window=10))
        # replace a straggler with one of the job's spares:
        RunConfig(straggler_config=StragglerConfig(replace=True, cool_off_s=1800))
    """

    score_threshold: float = 1.5
    window: int = 5
    min_excess_s: float = 0.05
    replace: bool = False
    cool_off_s: float = 600.0

    def __post_init__(self) -> None:
        def number(x: Any) -> bool:
            return isinstance(x, (int, float)) and not isinstance(x, bool)

        if not (number(self.score_threshold) and self.score_threshold > 1):
            raise ConfigError(
                f"StragglerConfig.score_threshold={self.score_threshold!r} is invalid: use a "
                "ratio to the median step time > 1, e.g. 1.5.",
                field="StragglerConfig.score_threshold")
        if not (isinstance(self.window, int) and not isinstance(self.window, bool)
                and self.window >= 1):
            raise ConfigError(
                f"StragglerConfig.window={self.window!r} is invalid: use a number of "
                "reports >= 1, e.g. 5.", field="StragglerConfig.window")
        if not (number(self.min_excess_s) and self.min_excess_s >= 0):
            raise ConfigError(
                f"StragglerConfig.min_excess_s={self.min_excess_s!r} is invalid: use a "
                "number of seconds >= 0, e.g. 0.05.", field="StragglerConfig.min_excess_s")
        if not isinstance(self.replace, bool):
            raise ConfigError(
                f"StragglerConfig.replace={self.replace!r} is invalid: use True (replace a "
                "named straggler with a spare) or False.", field="StragglerConfig.replace")
        if not (number(self.cool_off_s) and 0 <= self.cool_off_s < math.inf):
            raise ConfigError(
                f"StragglerConfig.cool_off_s={self.cool_off_s!r} is invalid: use a number of "
                "seconds >= 0, e.g. 600.", field="StragglerConfig.cool_off_s")


# The fields :func:`step_fields` adds to a metric row, and what they hold.
STEP_FIELDS: dict[str, str] = {
    "step_time_s": "the job's median step time (the lower median over the ranks): "
                   "per step() marker, or per report without markers",
    "slowest_rank": "the rank with the longest step time",
    "slowest_rank_score": "its step time over the median",
    "slowest_node": "its node (group rank)",
}


def _score(step_time: float, median: float) -> float:
    return step_time / median if median > 0 else 1.0


def scores(step_times: Sequence[float]) -> list[float]:
    """Each rank's step time over the job's lower median (1.0 where the median is 0)."""
    median = statistics.median_low(step_times)
    return [_score(t, median) for t in step_times]


def step_fields(step_times: Sequence[float], nodes: Sequence[int]) -> dict[str, Any]:
    """The row fields of one report: the median step time, and the slowest rank (the
    lowest of equals), its score and its node (``nodes[rank]``). Computed at every
    report: the scores follow the step times' order, so only the slowest is scored."""
    median = statistics.median_low(step_times)
    slowest = max(range(len(step_times)), key=step_times.__getitem__) if median > 0 else 0
    return {"step_time_s": median, "slowest_rank": slowest,
            "slowest_rank_score": round(_score(step_times[slowest], median), 3),
            "slowest_node": nodes[slowest]}


@dataclass(frozen=True)
class Straggler:
    """A node named slow: its slowest rank, that rank's latest score, and the first
    iteration and time of the window that named it (as stored in ``run.json``)."""

    node: int
    rank: int
    score: float
    since_iteration: int
    since: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Straggler:
        return cls(node=int(data["node"]), rank=int(data["rank"]),
                   score=float(data["score"]), since_iteration=int(data["since_iteration"]),
                   since=float(data["since"]))

    def describe(self) -> str:
        return (f"node {self.node} (rank {self.rank}) steps {self.score:.1f}x slower than "
                f"the median since iteration {self.since_iteration}")


class StragglerWatch:
    """Names a node that stays slow, from the rows in order; each node once per run of
    slow reports (it is named again only after a report where it was not slow).

    ``named`` is the straggler named in the run of slow reports still going on (None
    once a report breaks it, or before one is named)."""

    def __init__(self, config: StragglerConfig):
        self.config = config
        self._first: dict[str, Any] | None = None  # the first of the slow rows in a row
        self._count = 0
        self.named: Straggler | None = None

    def _slow(self, row: dict[str, Any]) -> bool:
        score, median = row.get("slowest_rank_score"), row.get("step_time_s")
        if score is None or median is None:
            return False
        return (score >= self.config.score_threshold
                and (score - 1) * median >= self.config.min_excess_s)

    def observe(self, row: dict[str, Any]) -> Straggler | None:
        """The node this row names a straggler, or None."""
        if not self._slow(row):
            self._first, self.named = None, None
            return None
        if self._first is None or self._first["slowest_node"] != row["slowest_node"]:
            self._first, self._count, self.named = row, 0, None
        self._count += 1
        if self._count < self.config.window or self.named is not None:
            return None
        self.named = Straggler(node=row["slowest_node"], rank=row["slowest_rank"],
                               score=row["slowest_rank_score"],
                               since_iteration=self._first.get("training_iteration", 0),
                               since=float(self._first.get("timestamp", 0)))
        return self.named
