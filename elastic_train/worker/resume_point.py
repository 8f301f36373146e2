"""Where a start of the worker group resumes from, agreed once by every rank.

:func:`agree_on_resume_point` is the whole agreement (collective): rank 0
sweeps the run directory (what cut-short uploads left goes; the committed
checkpoints are listed); every rank checks its share of the newest checkpoint
against the manifest (:mod:`elastic_train.storage.restore_check`: the files it
wrote, from or into its node's local tier), and if any rank found a bad file all
fall back to the previous one together; rank 0 sets the damaged ones aside
(:meth:`~elastic_train.storage.CheckpointStore.set_aside`: a report of the same
``checkpoint_dir_name`` is not refused when the group redoes it), then decides and
tells every rank.

:func:`decide_resume_point` is the decision, a pure function of what the run
directory holds: the newest committed checkpoint that is intact (asked newest
first, so older ones are never checked), the metric rows up to its
iteration (rows of a failed attempt after it are redone, so each
``training_iteration`` appears once; the checkpoint's own row is taken from its
manifest if its report failed before recording it), the next free checkpoint index (past
every index ever used, also by uncommitted leftovers), the training time the
kept history accounts for, and what the restart costs (recomputed iterations
and seconds, for goodput in ``elastic-train show``).

:func:`load_resume_point` is the I/O around it, on rank 0: it reads the rows,
decides, and rewrites ``metrics.jsonl`` to the kept rows. Every rank then gets
:meth:`ResumePoint.for_every_rank`; each data iterator finds its position in the
point's manifest (:mod:`.data_position`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from elastic_train.errors import StorageError
from elastic_train.storage import CommitManifest, RunStorage
from elastic_train.storage.restore_check import choose_intact
from elastic_train.storage.retention import CheckpointRecord
from elastic_train.storage.run_state import RestoreRecord
from elastic_train.worker.control_group import ControlGroup

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResumePoint:
    """The outcome of :func:`decide_resume_point`.

    Args:
        manifest: The checkpoint resumed from; None starts from scratch.
        next_index: The index of the next checkpoint reported.
        time_before_restore_s: The kept history's ``time_total_s``.
        kept_rows: The metric rows kept (rank 0 only; see :meth:`for_every_rank`).
        committed: Every committed checkpoint, for retention (rank 0 only).
        recomputed_iterations: Rows dropped: iterations the failed attempt redoes.
        recomputed_s: The training time those iterations took.
        is_restart: Whether the run had started before (a row or a checkpoint).
    """

    manifest: CommitManifest | None
    next_index: int
    time_before_restore_s: float = 0.0
    kept_rows: list[dict[str, Any]] = field(default_factory=list)
    committed: tuple[CheckpointRecord, ...] = ()
    recomputed_iterations: int = 0
    recomputed_s: float = 0.0
    is_restart: bool = False

    @property
    def training_iteration(self) -> int:
        """The iteration the run goes on from (0 from scratch)."""
        return self.manifest.training_iteration if self.manifest else 0

    def for_every_rank(self) -> ResumePoint:
        """What the other ranks need: without the history and the records, which only
        rank 0 uses (a long run's history would cost a broadcast of megabytes)."""
        return replace(self, kept_rows=[], committed=())

    def restart_entry(self, now: float) -> RestoreRecord | None:
        """The run's account of this restart (``restores.json``), or None on a first start."""
        if not self.is_restart:
            return None
        return RestoreRecord(time=now, restored_iteration=self.training_iteration,
                             recomputed_iterations=self.recomputed_iterations,
                             recomputed_s=self.recomputed_s)


def decide_resume_point(manifests: Sequence[CommitManifest], rows: Sequence[dict[str, Any]],
                   intact: Callable[[CommitManifest], bool],
                   removed: Sequence[int] = ()) -> ResumePoint:
    """The resume point, from the committed ``manifests`` (oldest first), the metric
    ``rows``, ``intact`` (asked of the newest first, until it says yes) and the indices
    of the uncommitted directories ``removed`` at this start."""
    restored = next((m for m in reversed(manifests) if intact(m)), None)
    last_iteration = restored.training_iteration if restored else 0
    kept = [r for r in rows if r.get("training_iteration", 0) <= last_iteration]
    dropped = len(rows) - len(kept)
    if restored is not None and restored.metrics.get("training_iteration") == last_iteration \
            and not any(r.get("training_iteration") == last_iteration for r in kept):
        # Its report committed the checkpoint, then failed before rank 0 recorded the row
        # (a SYNC commit's ranks agreeing on the upload when a peer died): the manifest
        # holds the row, so the history keeps each iteration once.
        kept.append(dict(restored.metrics))
    time_before = float(kept[-1].get("time_total_s", 0.0)) if kept else 0.0
    lost = float(rows[-1].get("time_total_s", 0.0)) - time_before if rows else 0.0
    return ResumePoint(
        manifest=restored,
        next_index=max([m.index for m in manifests] + list(removed) + [-1]) + 1,
        time_before_restore_s=time_before,
        kept_rows=kept,
        committed=tuple(CheckpointRecord(m.index, m.metrics) for m in manifests),
        recomputed_iterations=dropped,
        recomputed_s=max(lost, 0.0),
        is_restart=bool(rows) or restored is not None,
    )


def agree_on_resume_point(storage: RunStorage, group: ControlGroup,
                           rank: int) -> ResumePoint:
    """The resume point every rank of ``group`` resumes from (collective).

    Rank 0 sweeps the run directory; all ranks check their share of the newest
    committed checkpoint and fall back together (see
    :func:`~elastic_train.storage.restore_check.choose_intact`); rank 0 sets aside the
    checkpoints found damaged (their names are free for the reports that come again,
    their numbers stay used), decides and trims the history past the point, and every
    rank learns it.
    """
    swept = storage.checkpoints.sweep() if rank == 0 else None
    removed, manifests = group.broadcast(swept)
    storage.checkpoints.names.remember(manifests)  # custom directory names, on every rank
    chosen = choose_intact(storage.checkpoints, manifests, rank, group.world_size,
                           lambda ok: not group.any_rank(not ok)[0])
    point = None
    if rank == 0:
        damaged = [m.index for m in manifests if chosen is None or m.index > chosen.index]
        for index in damaged:  # found damaged by the ranks: their names are free again
            storage.checkpoints.set_aside(index)
        point = load_resume_point(storage, group.world_size,
                                   [m for m in manifests if m.index not in damaged], chosen,
                                   [*removed, *damaged])
    shared = group.broadcast(point.for_every_rank() if point is not None else None)
    return point if point is not None else shared


def load_resume_point(storage: RunStorage, world_size: int,
                       manifests: Sequence[CommitManifest], chosen: CommitManifest | None,
                       removed: Sequence[int] = ()) -> ResumePoint:
    """Rank 0's resume point once the ranks chose the checkpoint (``chosen``, one of the
    committed ``manifests``; None: none is intact): decide, keep the history up to it."""
    rows = storage.read_metrics()
    point = decide_resume_point(manifests, rows,
                           lambda m: chosen is not None and m.index == chosen.index, removed)
    if point.manifest and point.manifest.world_size != world_size:
        logger.warning(
            "Resuming from %s, written by %d workers, with %d: your checkpoint files are "
            "loaded as they are; dataset shards and prepared data loaders split the "
            "samples of the epoch not trained on yet over the new ranks.",
            point.manifest.name, point.manifest.world_size, world_size)
    if point.recomputed_iterations:
        logger.info("Dropping %d metric rows reported after the restored checkpoint.",
                    point.recomputed_iterations)
    # Rewritten at every start: this also drops a line a crash cut short.
    storage.write_metrics(point.kept_rows)
    entry = point.restart_entry(time.time())
    if entry is not None:
        try:
            storage.add_restore(entry)
        except StorageError:  # bookkeeping only: never fail a restart for it
            logger.warning("Could not record the restart in restores.json", exc_info=True)
    return point
