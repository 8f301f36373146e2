"""What the run monitor's look at the run directory tells :class:`.node_metrics.NodeMetrics`:
each new report's row, each checkpoint as it commits (upload lag and bytes), and the
goodput ledger's breakdown (goodput and badput by cause, checkpoint blocking).

Called from the run monitor's thread at each of its polls (about once a second); the
ledger is read at most every :data:`GOODPUT_EVERY_S` and at the end, since reading it
costs a listing and a few reads of the store. A store that cannot be read now is
skipped until the next poll (the monitor logs it).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from elastic_train.driver.node_metrics import NodeMetrics
from elastic_train.goodput.breakdown import Goodput, breakdown
from elastic_train.storage import RunStorage

logger = logging.getLogger(__name__)

GOODPUT_EVERY_S = 10.0


def run_goodput(storage: RunStorage) -> Goodput | None:
    """THE one call into the goodput ledger (:mod:`elastic_train.goodput.breakdown`, its
    one reader); None while the ledger has no line."""
    entries = storage.read_ledger()
    return breakdown(entries) if entries else None


def goodput_seconds(storage: RunStorage) -> dict[str, float] | None:
    """The run's wall time by cause, ``{"productive": s, "recompute": s, ...}``; None
    while the ledger has no line."""
    goodput = run_goodput(storage)
    return None if goodput is None else {c.value: s for c, s in goodput.seconds.items()}


class MetricsFeed:
    """Feeds ``metrics`` from what the run monitor reads of ``storage``."""

    def __init__(self, metrics: NodeMetrics, storage: RunStorage,
                 goodput_every_s: float = GOODPUT_EVERY_S):
        self.metrics = metrics
        self.storage = storage
        self.goodput_every_s = goodput_every_s
        self._uncommitted: dict[str, float] = {}  # checkpoint name -> its report's time
        self._next_goodput = 0.0

    def observe(self, row: dict[str, Any]) -> None:
        """A new report's row."""
        self.metrics.note_row(row)
        name = row.get("checkpoint_dir_name")
        if name:
            self._uncommitted[name] = float(row.get("timestamp") or time.time())

    def poll(self, final: bool = False) -> None:
        """Looks for the commits of reported checkpoints and, when due, at the ledger."""
        waiting = list(self._uncommitted.items())
        for at, (name, reported) in enumerate(waiting):
            manifest = self.storage.checkpoints.manifest_of(name)
            if manifest is not None:
                self.metrics.note_commit(time.time() - reported, manifest.size_bytes)
                for earlier, _ in waiting[:at + 1]:  # commits come in order: an earlier
                    self._uncommitted.pop(earlier, None)  # one still waiting never will
        if final or time.monotonic() >= self._next_goodput:
            goodput = run_goodput(self.storage)
            if goodput is not None:  # at the ledger's first lines, then every goodput_every_s
                self._next_goodput = time.monotonic() + self.goodput_every_s
                self.metrics.note_goodput({c.value: s for c, s in goodput.seconds.items()},
                                          goodput.live_recoveries)
