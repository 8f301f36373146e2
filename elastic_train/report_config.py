"""Ray Train v2's report and checkpoint-listing types, under Ray's names.

``CheckpointUploadMode`` says when ``report(checkpoint=...)`` returns,
``CheckpointConsistencyMode`` what ``get_all_reported_checkpoints()`` waits for,
and ``ReportedCheckpoint`` is what it returns. No torch import: ``elastic-train ls``
and ``show`` may load this module.

Example::

    elastic_train.report(metrics, checkpoint=ckpt,
                         checkpoint_upload_mode=CheckpointUploadMode.SYNC)
    for reported in elastic_train.get_all_reported_checkpoints(
            CheckpointConsistencyMode.COMMITTED):
        print(reported.checkpoint.path, reported.metrics["loss"], reported.status)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from elastic_train.checkpoint import Checkpoint


class CheckpointUploadMode(str, enum.Enum):
    """When ``report(checkpoint=...)`` returns (Ray Train v2's names).

    ``ASYNC`` (our default): once the checkpoint's files are staged on local
    disk; the upload and the commit run in the background, with at most one
    checkpoint uploading and one queued (a further report waits). Training does not stall on the
    network, and nothing is lost: a checkpoint becomes visible only when
    committed, and the run ends only after every pending upload is committed.
    When a rank raises, its process lives (in-process restarts), so the
    checkpoints reported before the error are still committed -- before the
    restart, within half of ``FailureConfig.unwind_timeout_s``, or before the
    run ends when no restart is left -- and the restart resumes from the last
    one reported, as after SYNC. Only a crash (a process or node lost) resumes
    from the last one committed, as it would under SYNC mid-upload.
    Ray's default is SYNC; ours is ASYNC because the staged copy makes the
    checkpoint safe as soon as ``report()`` returns, so waiting for the network buys
    nothing but a stalled step.
    ``SYNC``: after the checkpoint is committed on every rank (Ray v2's default).

    ``NO_UPLOAD`` (Ray's): the user already wrote the files into a directory of
    the run and a rank reports ``Checkpoint(<run>/<name>)`` (any rank, as in Ray;
    ranks that report one report the same); nothing is uploaded,
    and ``report()`` returns once the checkpoint is committed -- its manifest (file
    list, sizes, CRC-32s) is read from the files where they are, so a checkpoint is
    still visible only once committed whole.
    """

    SYNC = "SYNC"
    ASYNC = "ASYNC"
    NO_UPLOAD = "NO_UPLOAD"

    def default_delete_local_checkpoint_after_upload(self) -> bool:
        """Ray's default of ``report(delete_local_checkpoint_after_upload=None)``:
        True for ASYNC only (the user's directory is not needed once staged)."""
        return self is CheckpointUploadMode.ASYNC


class CheckpointConsistencyMode(str, enum.Enum):
    """What ``get_all_reported_checkpoints()`` waits for before it lists (Ray's names).

    ``COMMITTED``: the checkpoints of every ``report()`` this rank made are committed.
    ``VALIDATED`` (the default): also no checkpoint of the run waits for its
    asynchronous validation (``report(validation=...)``; Ray's rule).
    """

    COMMITTED = "COMMITTED"
    VALIDATED = "VALIDATED"


class ReportedCheckpointStatus(str, enum.Enum):
    """Where a reported checkpoint stands (Ray's names).

    ``COMMITTED``: stored, no validation asked for. ``PENDING_VALIDATION``: stored, its
    validation queued or running. ``VALIDATED``: the validation returned; its metrics
    are merged into the checkpoint's. ``VALIDATION_TIMEOUT``: it outlived
    ``ValidationTaskConfig.timeout_s`` and was killed. ``VALIDATION_FAILED``: it raised
    or returned no dict (the manifest keeps the traceback). The metrics of the last two
    are the training's, as reported.
    """

    COMMITTED = "COMMITTED"
    PENDING_VALIDATION = "PENDING_VALIDATION"
    VALIDATED = "VALIDATED"
    VALIDATION_TIMEOUT = "VALIDATION_TIMEOUT"
    VALIDATION_FAILED = "VALIDATION_FAILED"


@dataclass
class ReportedCheckpoint:
    """A committed checkpoint, the metrics row reported with it, and its status."""

    checkpoint: Checkpoint
    metrics: dict[str, Any]
    status: ReportedCheckpointStatus
