"""``get_all_reported_checkpoints()``: the run's checkpoints as Ray 2.60 lists them.

Ray asks its controller, which keeps the checkpoints its manager has not deleted
(top-k plus the latest). Here there is no controller: the committed checkpoints
in the run directory are that set -- retention deletes the others and never the
latest --, so any rank reads them from storage, without a collective. Before it
reads, it waits (up to ``timeout_s``) until the newest checkpoint this rank
reported is committed -- with ``VALIDATED``, also until no checkpoint of the run
waits for its validation (Ray's predicate: no pending validation at all); on a
timeout it lists what is there then, as Ray does. Each checkpoint's status is its
manifest's (``COMMITTED`` when no validation was asked for).

Example::

    wait_until_committed(store, 7, raise_if_failed, deadline=None)
    listed = reported_checkpoints(store, CheckpointConfig(num_to_keep=2))
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from elastic_train.checkpoint import committed_checkpoint
from elastic_train.errors import ConfigError
from elastic_train.report_config import (
    CheckpointConsistencyMode,
    ReportedCheckpoint,
    ReportedCheckpointStatus,
)
from elastic_train.storage.retention import CheckpointRecord, ranked

if TYPE_CHECKING:
    from elastic_train.config import CheckpointConfig
    from elastic_train.storage import CheckpointStore, CommitManifest

logger = logging.getLogger(__name__)


def checked_wait(consistency_mode: object, timeout_s: object) -> float | None:
    """The deadline (``time.monotonic()``; None: none) for the arguments, checked."""
    try:
        CheckpointConsistencyMode(consistency_mode)
    except ValueError:
        raise ConfigError(
            f"get_all_reported_checkpoints(consistency_mode={consistency_mode!r}): use "
            "CheckpointConsistencyMode.COMMITTED or .VALIDATED.") from None
    if timeout_s is None:
        return None
    if not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool) or timeout_s < 0:
        raise ConfigError(f"get_all_reported_checkpoints(timeout_s={timeout_s!r}): pass a "
                          "number of seconds >= 0, or None to wait as long as it takes.")
    return time.monotonic() + timeout_s


def wait_until_committed(store: CheckpointStore, index: int,
                         raise_if_failed: Callable[[], None], deadline: float | None) -> bool:
    """Waits until checkpoint ``index`` is committed; False once ``deadline`` passed
    first. ``raise_if_failed`` raises this rank's upload error, which would otherwise
    leave it waiting for a commit that never comes."""
    delay = 0.01
    while not store.is_committed(store.name(index)):
        raise_if_failed()
        if deadline is not None and time.monotonic() >= deadline:
            logger.info("get_all_reported_checkpoints(): %s is not committed yet; listing "
                        "what is.", store.name(index))
            return False
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        time.sleep(delay if left is None else min(delay, left))
        delay = min(delay * 2, 0.5)
    return True


def wait_until_validated(store: CheckpointStore, deadline: float | None) -> bool:
    """Waits until no committed checkpoint is ``PENDING_VALIDATION``; False once
    ``deadline`` passed first."""
    delay = 0.05
    while pending := [m.name for m in store.committed() if m.validation_pending]:
        if deadline is not None and time.monotonic() >= deadline:
            logger.info("get_all_reported_checkpoints(): %s not validated yet; listing "
                        "what is.", ", ".join(pending))
            return False
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        time.sleep(delay if left is None else min(delay, left))
        delay = min(delay * 2, 0.5)
    return True


def status_of(manifest: CommitManifest) -> ReportedCheckpointStatus:
    """The checkpoint's status: its validation's, else ``COMMITTED``."""
    return ReportedCheckpointStatus(manifest.validation.get("status", "COMMITTED"))


def reported_checkpoints(store: CheckpointStore, config: CheckpointConfig
                         ) -> list[ReportedCheckpoint]:
    """The committed checkpoints in Ray's order: by report without a score attribute,
    worst to best by score with one (the best last)."""
    manifests = {m.index: m for m in store.committed()}
    records = [CheckpointRecord(m.index, m.metrics) for m in manifests.values()]
    return [ReportedCheckpoint(
        committed_checkpoint(store.path(r.index), store.fs, manifests[r.index]),
        manifests[r.index].metrics, status_of(manifests[r.index]))
        for r in reversed(ranked(records, config))]
