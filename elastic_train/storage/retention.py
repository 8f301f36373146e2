"""Top-k checkpoint retention as a pure decision, testable without storage.

Given the committed checkpoints (index and metrics, oldest first), say which to
delete: keep the ``num_to_keep`` best by the score attribute (or the most
recent without one) and always the latest, so a run can resume, and every one whose
asynchronous validation is still pending (as Ray's manager keeps them: the validation
may make it one of the best). A checkpoint
whose metrics lack the score attribute -- one committed before a resume changed
``checkpoint_score_attribute`` -- ranks below every scored one (the newest first
among such), so the ranking never fails: ``report()`` refuses a *new* checkpoint
without the attribute before it is uploaded (:func:`score_of`). A NaN score (a
diverged loss) is a number, not a mistake: it ranks below every other number, as
Ray's manager ranks it, and the run goes on.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from elastic_train.config import CheckpointConfig
from elastic_train.errors import ConfigError


@dataclass(frozen=True)
class CheckpointRecord:
    """What retention needs to know of a committed checkpoint."""

    index: int
    metrics: dict[str, Any]


def score_of(record: CheckpointRecord, config: CheckpointConfig) -> float:
    """The record's score, named in errors when the metric is missing or not a number."""
    attr = config.checkpoint_score_attribute
    if attr not in record.metrics:
        raise ConfigError(
            f"CheckpointConfig.checkpoint_score_attribute={attr!r} is not among the metrics "
            f"reported with checkpoint {record.index} ({sorted(record.metrics)}): report it "
            "with every checkpoint, or choose another attribute.",
            field="CheckpointConfig.checkpoint_score_attribute")
    value = record.metrics[attr]
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ConfigError(
            f"CheckpointConfig.checkpoint_score_attribute={attr!r} must name a number, "
            f"but checkpoint {record.index} reported {value!r}.",
            field="CheckpointConfig.checkpoint_score_attribute")
    return float(value)


def _score_or_none(record: CheckpointRecord, config: CheckpointConfig) -> float | None:
    try:
        return score_of(record, config)
    except ConfigError:
        return None


def ranked(records: Sequence[CheckpointRecord], config: CheckpointConfig
           ) -> list[CheckpointRecord]:
    """Best first: by score in the configured order, ties by recency; then NaN scores,
    then records without a score, each newest first."""
    if config.checkpoint_score_attribute is None:
        return sorted(records, key=lambda r: -r.index)
    sign = -1.0 if config.checkpoint_score_order == "max" else 1.0

    def key(record: CheckpointRecord) -> tuple[bool, bool, float, int]:
        score = _score_or_none(record, config)
        unranked = score is None or math.isnan(score)
        return (score is None, unranked, 0.0 if unranked else sign * score, -record.index)

    return sorted(records, key=key)


def to_delete(records: Sequence[CheckpointRecord], config: CheckpointConfig,
              pending: Collection[int] = ()) -> list[int]:
    """Indices of the checkpoints retention removes (never the latest, never one of
    ``pending``: those waiting for their validation)."""
    if config.num_to_keep is None or not records:
        return []
    latest = max(r.index for r in records)
    keep = {r.index for r in ranked(records, config)[: config.num_to_keep]} | {latest}
    keep |= set(pending)
    return sorted(r.index for r in records if r.index not in keep)
