"""The worker side of the public API: ``report``, ``get_checkpoint``, ``get_context``,
``get_dataset_shard``, ``get_preemption_info``, ``step``.

One :class:`TrainSession` lives in each worker process while the train
function runs. The ranks agree, once per start, on the committed checkpoint the
group resumes from (:mod:`.restore`: each checks its share, rank 0 decides), so
that all ranks restore the same state. ``report()`` is collective: the ranks
first learn whether any of them passes a checkpoint (one small all_reduce, which
also carries each rank's step time for the straggler scores, :mod:`.step_times`); if
one does, they agree on the file list (each file is uploaded by the lowest rank
that has it) and upload; what rank 0 alone does -- the score check, the manifest,
the metrics row, the commit and retention -- is its :mod:`.committer`'s. The
hooks of :mod:`.after_report` run after every report.

Example::

    def train_func(config):
        start = 0
        if (ckpt := elastic_train.get_checkpoint()):
            with ckpt.as_directory() as d:
                start = torch.load(os.path.join(d, "state.pt"))["epoch"] + 1
        for epoch in range(start, config["epochs"]):
            ...
            elastic_train.report({"loss": loss.item()}, checkpoint=...)
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from elastic_train.checkpoint import Checkpoint
from elastic_train.context import StorageInfo, TrainContext, WorkerEnv
from elastic_train.errors import ConfigError, StorageError
from elastic_train.metric_rows import clean_metrics
from elastic_train.storage import CommitManifest, RunStorage
from elastic_train.storage import filesystem as fsutil
from elastic_train.storage.checkpoint_store import dir_name
from elastic_train.storage.uploader import UploadJob, listed_files
from elastic_train.stragglers import step_fields
from elastic_train.worker import preemption
from elastic_train.worker.after_report import AFTER_REPORT, AfterReport
from elastic_train.worker.backend import WorkerResources
from elastic_train.worker.dataset import DatasetShard, ResumableIterable
from elastic_train.worker.joined_session import JoinedSession
from elastic_train.worker.preemption import PreemptionInfo
from elastic_train.worker.restore import resumable_state
from elastic_train.worker.run_spec import RunSpec
from elastic_train.worker.step_times import StepClock

logger = logging.getLogger(__name__)

_session: TrainSession | None = None
_session_factory: Callable[[], TrainSession] | None = None


class CheckpointUploadMode(str, enum.Enum):
    """When ``report(checkpoint=...)`` returns (Ray Train v2's names).

    ``ASYNC`` (our default): once the checkpoint's files are staged on local
    disk; the upload and the commit run in the background, with at most one
    checkpoint uploading and one queued (a further report waits). Training does not stall on the
    network, and nothing is lost: a checkpoint becomes visible only when
    committed, a crash before that resumes from the previous one, and the run
    ends only after every pending upload is committed -- also when it ends
    in a failure with no restart left, while the failed rank's process lives
    (in-process restarts; within ``FailureConfig.unwind_timeout_s``).
    ``SYNC``: after the checkpoint is committed on every rank (Ray v2's default).

    ``NO_UPLOAD`` (Ray's: the user already wrote the files into storage) is
    a member so that Ray scripts import, but ``report()`` refuses it with a
    ``ConfigError``: a checkpoint here becomes visible only through its commit
    manifest (file list, sizes, CRC-32s, data positions), which is built from
    the files the ranks stage; files written straight into storage by hand
    would bypass the atomic commit.
    """

    SYNC = "SYNC"
    ASYNC = "ASYNC"
    NO_UPLOAD = "NO_UPLOAD"


class TrainSession:
    """Per-worker state behind the public session functions.

    Built at the start of each attempt by each rank alone (the context, the
    preemption notice handler); :meth:`join` then agrees with the other ranks on
    where the run continues and builds the rest (:class:`.joined_session.JoinedSession`:
    report rows, checkpoint numbering, uploader and, on rank 0, the committer).
    ``report()`` checks its arguments, lets the ranks agree on checkpoints and
    preemption notices, hands rank 0's duties to :mod:`.committer` and then runs the
    ``after_report`` hooks (:mod:`.after_report`).
    """

    def __init__(self, spec: RunSpec, env: WorkerEnv, resources: WorkerResources,
                 storage: RunStorage, staging_dir: str, join: bool = True,
                 after_report: Sequence[AfterReport] = AFTER_REPORT):
        self.spec = spec
        self.env = env
        self.resources = resources
        self.storage = storage
        self.seed = 0
        self.context = TrainContext(
            env=env,
            experiment_name=spec.experiment_name,
            storage=StorageInfo(
                storage_path=spec.run_config.storage_path,
                experiment_dir_name=spec.experiment_name,
                experiment_fs_path=storage.run_path,
                storage_filesystem=storage.fs,
            ),
            metadata=spec.metadata,
        )
        self._shards: dict[str, DatasetShard] = {}
        self._resumables: dict[str, ResumableIterable] = {}
        self._loader_count = 0
        self._created_at = time.time()
        self._staging_dir = staging_dir
        self._after_report = tuple(after_report)
        self._preemption: PreemptionInfo | None = None
        self._joined: JoinedSession | None = None
        self._synced: CommitManifest | None = None  # the newest SYNC commit of the attempt
        self.step_clock = StepClock()  # for the straggler scores (see .step_times)
        preemption.install()
        if join:
            self.join()

    def join(self) -> JoinedSession:
        """Agrees with the other ranks on where the run continues, once (collective).

        ``fit()``'s workers join as the session is built; a script under
        ``elastic-train launch`` at its first session call that needs the
        agreement (``report``, ``get_checkpoint``, ``get_preemption_info``,
        dataset shards and prepared loaders), so that ``get_context()`` on one
        rank alone does not wait for the others.
        """
        if self._joined is None:
            self._joined = JoinedSession.join(
                self.storage, self.env, self.spec.run_config.checkpoint_config,
                self._control_group(), self._staging_dir, self._created_at)
        return self._joined

    def _control_group(self) -> Any:
        """The process group of the session's collectives (see :mod:`.control_group`)."""
        return self.resources.control_group

    def _latest(self) -> CommitManifest | None:
        """The checkpoint the group would resume from now: the one the ranks restored, or
        one committed synchronously since."""
        return self._synced or self.join().restored

    # resumable iterables (dataset shards, prepared data loaders)
    def register_resumable(self, key: str, iterable: ResumableIterable) -> None:
        """Tracks ``iterable``'s position in checkpoints and restores it now if saved."""
        self._resumables[key] = iterable
        latest = self._latest()
        if not latest:
            return
        state = resumable_state(latest, self.env.rank, self.env.world_size, key)
        if state is not None:
            iterable.load_state_dict(state)

    def next_loader_key(self) -> str:
        self._loader_count += 1
        return f"loader:{self._loader_count - 1}"

    def get_dataset_shard(self, dataset_name: str | None = None) -> DatasetShard:
        name = dataset_name
        if name is None:  # Ray's default: the only dataset
            if len(self.spec.datasets) != 1:
                raise KeyError(
                    "get_dataset_shard() without a name needs exactly one dataset; the trainer "
                    f"was given {sorted(self.spec.datasets)}: pass one of these names.")
            [name] = self.spec.datasets
        if name not in self._shards:
            if name not in self.spec.datasets:
                raise KeyError(
                    f"get_dataset_shard({name!r}): no such dataset; the trainer was given "
                    f"{sorted(self.spec.datasets)}."
                )
            shard = DatasetShard(self.spec.datasets[name], self.env.rank, self.env.world_size,
                                 self.resources.devices[0], lambda: self.seed)
            self.register_resumable(f"dataset:{name}", shard)
            self._shards[name] = shard
        return self._shards[name]

    def get_checkpoint(self) -> Checkpoint | None:
        latest = self._latest()
        if latest is not None:
            return Checkpoint(self.storage.checkpoints.path(latest.index), self.storage.fs)
        return self.spec.resume_from_checkpoint

    # preemption notices
    def _note_preemption(self, notices: list[tuple[int, str, float] | None]
                         ) -> PreemptionInfo | None:
        info = preemption.agree(notices)
        if info is not None and self._preemption is None:
            logger.warning("Preemption notice for rank(s) %s on %s: %.0f s left to checkpoint.",
                           list(info.ranks), ", ".join(info.hostnames),
                           info.deadline - time.time())
            preemption.leave_mark(self.env.rank)
            self._preemption = info
        return info

    def get_preemption_info(self) -> PreemptionInfo | None:
        return self._note_preemption(self.join().group.all_gather(preemption.local_notice()))

    # report
    def report(self, metrics: dict[str, Any], checkpoint: Checkpoint | None = None,
               checkpoint_upload_mode: CheckpointUploadMode = CheckpointUploadMode.ASYNC
               ) -> None:
        """One report (collective): the arguments checked, the ranks' agreement on
        checkpoints and preemption notices, rank 0's duties handed to its committer,
        then the after-report hooks."""
        clean, mode = _checked_report(metrics, checkpoint, checkpoint_upload_mode)
        joined = self.join()
        joined.uploader.raise_if_failed()
        row = joined.rows.next(clean)
        files = (listed_files(checkpoint.path, checkpoint.written)
                 if checkpoint is not None else None)
        notice = preemption.local_notice()
        # Most reports carry metrics alone: then the ranks only learn that nobody
        # has a checkpoint or a notice, and each rank's step time and node.
        (any_checkpoint, any_notice), each = joined.group.any_rank_and_each(
            (files is not None, notice is not None),
            (self.step_clock.report_begins(), self.env.node_rank))
        row.update(step_fields([t for t, _ in each], [int(n) for _, n in each]))
        if any_checkpoint and joined.committer is not None:  # whichever rank holds files
            joined.committer.check_score(clean, joined.numbers.next_index)
        if any_checkpoint or any_notice:
            states = ({key: it.state_dict() for key, it in self._resumables.items()}
                      if any_checkpoint else {})
            gathered = joined.group.all_gather((files, states, notice))
            if self._note_preemption([n for _, _, n in gathered]) is not None:
                mode = CheckpointUploadMode.SYNC  # the node may go any moment: commit now
            if any_checkpoint:
                row["checkpoint_dir_name"] = dir_name(joined.numbers.next_index)
                self._persist_checkpoint([(f, s) for f, s, _ in gathered], checkpoint, row,
                                         mode)
        if joined.committer is not None:
            joined.committer.record_row(row)
        for hook in self._after_report:
            hook(joined.rows.iteration, self.env)
        self.step_clock.report_ends()

    def _persist_checkpoint(self, gathered: list[tuple[list[str] | str | None, dict]],
                            checkpoint: Checkpoint | None, row: dict[str, Any],
                            mode: CheckpointUploadMode) -> None:
        """Each file goes up from the lowest rank that has it; rank 0 commits after all."""
        joined = self.join()
        index = joined.numbers.reserve()
        manifest = (joined.committer.manifest(index, row, [states for _, states in gathered])
                    if joined.committer is not None else None)
        job = UploadJob.plan(index, [files for files, _ in gathered], self.env.rank, manifest)
        joined.uploader.submit(job, checkpoint.path if checkpoint is not None else None,
                               checkpoint.written if checkpoint is not None else None)
        if mode is CheckpointUploadMode.SYNC:
            errors = [e for e in joined.group.all_gather(joined.uploader.wait_for(index)) if e]
            if errors:
                raise StorageError(f"{self.storage.display_path}: {'; '.join(errors)}")
            self._synced = CommitManifest(index, joined.rows.iteration, row, {},
                                          self.env.world_size)

    def finish(self) -> None:
        """Waits for pending uploads and commits (the run ends only when they are stored)."""
        if self._joined is not None:
            self._joined.uploader.close()

    def uploads_in_flight(self) -> bool:
        """Whether a reported checkpoint of this rank is not uploaded (and, on rank 0,
        committed) yet."""
        return self._joined is not None and self._joined.uploader.in_flight()

    def end_failed_attempt(self, finish_uploads: bool) -> None:
        """Ends a failed attempt's session (in-process restarts). Before another attempt
        (``finish_uploads`` False) it ends at once: uploads not committed yet are
        dropped, as if the process had died. When the run stops after this attempt,
        the uploads in flight are finished and committed first: a checkpoint every
        rank reported is kept although a rank failed after reporting it (an upload
        error is logged: the run has failed already). A session that never joined (the
        attempt failed before its first call that needs the other ranks) has nothing
        to drop or finish."""
        joined = self._joined
        if joined is None:
            return
        if not finish_uploads:
            if joined.committer is not None:
                joined.committer.cancel()
            joined.uploader.abandon()
            return
        try:
            joined.uploader.close()
        except StorageError as exc:
            logger.error("The checkpoint in flight when the run failed was not stored: %s",
                         exc)


def _checked_report(metrics: Any, checkpoint: Any, mode: Any
                    ) -> tuple[dict[str, Any], CheckpointUploadMode]:
    """``report()``'s arguments, checked before any rank waits for another: the metrics
    as JSON values and the upload mode; a ConfigError with the way out otherwise."""
    clean = clean_metrics(metrics)
    if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
        raise ConfigError(f"report(checkpoint={checkpoint!r}) must be a Checkpoint.")
    if checkpoint is not None and not fsutil.is_local(checkpoint.filesystem):
        raise ConfigError(f"report(checkpoint={checkpoint!r}): pass a local directory, "
                          "Checkpoint.from_directory(path).")
    mode = CheckpointUploadMode(mode)
    if mode is CheckpointUploadMode.NO_UPLOAD:
        raise ConfigError(
            "report(checkpoint_upload_mode=NO_UPLOAD) is not supported: a checkpoint "
            "becomes visible only through the commit of the files the ranks report. Save "
            "the files into a local directory and report it (ASYNC, the default, uploads "
            "it without stalling training).")
    return clean, mode


def uploads_in_flight() -> bool:
    """Whether this worker's session has a checkpoint upload not finished yet."""
    return _session is not None and _session.uploads_in_flight()


def init_session(session: TrainSession) -> None:
    global _session
    _session = session


def shutdown_session() -> None:
    global _session
    _session = None


def set_session_factory(factory: Callable[[], TrainSession]) -> None:
    """Makes the first session call build the session (scripts under ``elastic-train launch``)."""
    global _session_factory
    _session_factory = factory


def current_session() -> TrainSession | None:
    """The session if one was started, without starting one."""
    return _session


def get_session() -> TrainSession:
    global _session
    if _session is None and _session_factory is not None:
        _session = _session_factory()
    if _session is None:
        raise RuntimeError(
            "No training session: report(), get_checkpoint(), get_context() and "
            "get_dataset_shard() work only inside a train function run by a trainer."
        )
    return _session


def report(metrics: dict[str, Any], checkpoint: Checkpoint | None = None,
           checkpoint_dir_name: str | None = None,
           checkpoint_upload_mode: CheckpointUploadMode = CheckpointUploadMode.ASYNC) -> None:
    """Reports metrics (and optionally a checkpoint) from this worker.

    Every rank must call it the same number of times. Rank 0's metrics are
    recorded; the checkpoint files of every rank that passes one are merged
    into one committed checkpoint. See :class:`CheckpointUploadMode` for when
    the call returns (our default is ASYNC, Ray v2's SYNC). A checkpoint whose
    files are still being written (``Checkpoint.from_directory(d, written=future)``,
    e.g. from ``dcp.async_save``) does not wait for them: they go up once written.

    ``checkpoint_dir_name`` is Ray's argument (arguments in Ray's order); any
    name but None is refused: checkpoint directories here are
    ``checkpoint_NNNNNN``, the number ordering them for retention and resume.
    """
    if checkpoint_dir_name is not None:
        raise ConfigError(
            f"report(checkpoint_dir_name={checkpoint_dir_name!r}) is not supported: checkpoint "
            "directories are named checkpoint_NNNNNN here (the number orders them for "
            "retention and resume). Drop the argument; to tell checkpoints apart, report the "
            "value as a metric or put it in the checkpoint with Checkpoint.set_metadata().")
    get_session().report(metrics, checkpoint, checkpoint_upload_mode)


def step() -> None:
    """Marks the end of one training step of this rank (optional; our addition).

    With markers, a rank's straggler score (``slowest_rank_score`` in the metric
    rows; see :mod:`elastic_train.stragglers`) compares time per step; without, time
    per report. Local and cheap: a counter, no collective.

    Example::

        for batch in loader:
            train_step(batch)
            elastic_train.step()
        elastic_train.report({"loss": loss})
    """
    get_session().step_clock.step()


def get_checkpoint() -> Checkpoint | None:
    """The latest committed checkpoint of this run, or the trainer's
    ``resume_from_checkpoint`` on a fresh run, or None."""
    return get_session().get_checkpoint()


def get_context() -> TrainContext:
    """This worker's :class:`TrainContext` (ranks, world size, run name, storage)."""
    return get_session().context


def get_dataset_shard(dataset_name: str | None = None) -> DatasetShard:
    """This rank's shard of ``datasets[dataset_name]`` (Ray's argument name); without a
    name, of the trainer's only dataset."""
    return get_session().get_dataset_shard(dataset_name)


def get_preemption_info() -> PreemptionInfo | None:
    """The imminent preemption of a node of this job, or None (Ray Train's name).

    Collective: every rank must call it the same number of times, like
    ``report()``. A rank's node is being preempted once the rank got a SIGTERM
    (from the scheduler, or from its agent when the agent got one); the
    recommended reaction is to report a checkpoint now -- it is committed
    before ``report()`` returns -- and keep training until the deadline. When
    the node goes, the group restarts from that checkpoint, charged to
    ``FailureConfig.max_preemption_failures``. See :mod:`elastic_train.worker.preemption`.

    Example::

        if elastic_train.get_preemption_info() is not None and not saved:
            elastic_train.report(metrics, checkpoint=checkpoint)
            saved = True
    """
    return get_session().get_preemption_info()
