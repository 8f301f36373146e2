"""What a session learns when the ranks join, and what it builds from it.

:meth:`JoinedSession.join` is the whole join (collective, once per attempt): the
ranks agree on the resume point (:mod:`.resume_point`) and rank 0 tells them the run's
goodput history, and from them each rank builds its report rows
(:mod:`elastic_train._internal.metric_rows`), its checkpoint numbering, its background uploader
and its :class:`~.attempt_clock.AttemptClock`; rank 0 also its
:class:`~.committer.Committer` and, when the trainer has a ``validation_config``, its
:class:`~.validation_runner.ValidationRunner` (which first takes the validations an
earlier attempt left pending). The result is one frozen object, so no part of the
session exists half-built.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from elastic_train._internal.metric_rows import ReportRows
from elastic_train.storage import node_settings
from elastic_train.storage.peer_replicas import PeerRing
from elastic_train.storage.uploader import CheckpointUploader
from elastic_train.worker.attempt_clock import AttemptClock, RunHistory
from elastic_train.worker.committer import Committer
from elastic_train.worker.control_group import ControlGroup
from elastic_train.worker.resume_point import agree_on_resume_point
from elastic_train.worker.validation_runner import ValidationRunner

if TYPE_CHECKING:
    from elastic_train.config import CheckpointConfig
    from elastic_train.context import WorkerEnv
    from elastic_train.storage import CommitManifest, RunStorage
    from elastic_train.storage.replica_server import NodeReplica
    from elastic_train.validation_config import ValidationConfig


@dataclass
class CheckpointNumbers:
    """The indices of the checkpoints an attempt reports, starting past every index the
    run ever used. Every rank keeps one and reserves in step, as ``report()`` is
    collective, so the ranks agree on each index without a message."""

    next_index: int = 0

    def reserve(self) -> int:
        """The index of the checkpoint being reported; the next one gets the next."""
        index = self.next_index
        self.next_index += 1
        return index


def peer_ring(group: ControlGroup, env: WorkerEnv, config: CheckpointConfig,
              replica: NodeReplica | None) -> PeerRing | None:
    """Where every node serves its tier and with which key, this node's as ``replica``
    says (collective in a multi-node job that asked for peer copies, over the job's own
    process group; see :mod:`elastic_train.storage.peer_replicas`); None when no node
    serves."""
    if config.peer_replicas == 0 or env.world_size == env.local_world_size:
        return None
    mine = (replica.url, replica.key) if replica else ("", "")
    gathered = group.all_gather((env.node_rank, *mine))
    if not any(url for _, url, _ in gathered):
        return None
    return PeerRing.of(env.node_rank, gathered, config.peer_replicas, env.local_world_size,
                       replica.tls if replica else None)


@dataclass(frozen=True)
class JoinedSession:
    """A session's state once the ranks agreed where the run continues.

    Attributes:
        group: The collectives of the session (see :mod:`.control_group`).
        restored: The checkpoint the ranks resumed from; None starts from scratch.
        rows: Numbers the reports and fills in their automatic fields.
        numbers: Numbers the reported checkpoints.
        uploader: Uploads this rank's checkpoint files in the background.
        committer: Rank 0's commit duties; None on every other rank.
        clock: Times the reports for the goodput ledger and ``should_checkpoint()``.
    """

    group: ControlGroup
    restored: CommitManifest | None
    rows: ReportRows
    numbers: CheckpointNumbers
    uploader: CheckpointUploader
    committer: Committer | None
    clock: AttemptClock

    @classmethod
    def join(cls, storage: RunStorage, env: WorkerEnv, config: CheckpointConfig,
             control_group: Any, staging_dir: str, started_at: float,
             validation: ValidationConfig | None = None,
             devices: Sequence[Any] = ()) -> JoinedSession:
        """Agrees with the other ranks on the resume point (collective) and builds the
        attempt's parts from it; ``started_at`` is when the session began, ``validation``
        the trainer's validation settings, ``devices`` this rank's (rank 0's are its
        validations')."""
        group = ControlGroup(env.world_size, control_group)
        settings = node_settings.current()
        node_settings.use(replace(settings, peers=peer_ring(group, env, config,
                                                             settings.replica)))
        point = agree_on_resume_point(storage, group, env.rank)
        committer = Committer(storage, config, point.kept_rows, point.committed) \
            if env.rank == 0 else None
        if committer is not None and validation is not None:
            committer.validations = ValidationRunner(
                validation, storage.checkpoints, committer.finish_validation,
                os.path.join(os.path.dirname(staging_dir), "validations"), devices)
            committer.requeue_validations()
        uploader = CheckpointUploader(storage.checkpoints, env.rank, staging_dir,
                                      commit=committer.commit if committer else None)
        history = group.broadcast(RunHistory.read(storage) if env.rank == 0 else None)
        clock = AttemptClock(history, point.training_iteration,
                             storage.ledger_file("rank0") if env.rank == 0 else None)
        clock.ready(started_at, point.training_iteration if point.is_restart else None,
                    env.world_size)
        return cls(group=group, restored=point.manifest,
                   rows=ReportRows(point.training_iteration, point.time_before_restore_s,
                                   started_at),
                   numbers=CheckpointNumbers(point.next_index), uploader=uploader,
                   committer=committer, clock=clock)
