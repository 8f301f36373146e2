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

import logging
import shutil
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch.distributed as dist

from elastic_train._internal.setting_values import seconds
from elastic_train.checkpoint import Checkpoint, committed_checkpoint
from elastic_train.context import StorageInfo, TrainContext, WorkerEnv
from elastic_train.errors import ConfigError, StorageError
from elastic_train.goodput.interval import PRIOR_MTBF_S
from elastic_train.report_config import (
    CheckpointConsistencyMode,
    CheckpointUploadMode,
    ReportedCheckpoint,
)
from elastic_train.storage import CommitManifest, RunStorage
from elastic_train.storage.uploader import BY_UPLOAD_FN, IN_PLACE, UploadJob, listed_files
from elastic_train.stragglers import step_fields
from elastic_train.validation_config import ValidationTaskConfig
from elastic_train.worker import preemption
from elastic_train.worker import upload_fn as by_upload_fn
from elastic_train.worker.after_report import AFTER_REPORT, AfterReport
from elastic_train.worker.attempt_clock import SHARED
from elastic_train.worker.backend import WorkerResources
from elastic_train.worker.data_position import Resumable, Resumed, every_rank, ranks_states
from elastic_train.worker.dataset import DatasetShard
from elastic_train.worker.even_reports import uneven_reports
from elastic_train.worker.joined_session import JoinedSession
from elastic_train.worker.preemption import PreemptionInfo
from elastic_train.worker.report_args import ReportArgs
from elastic_train.worker.reported_checkpoints import (
    checked_wait,
    reported_checkpoints,
    wait_until_committed,
    wait_until_validated,
)
from elastic_train.worker.run_spec import RunSpec
from elastic_train.worker.step_times import StepClock

logger = logging.getLogger(__name__)


class _RankShare(NamedTuple):
    """What each rank tells the others in a ``report()`` with a checkpoint or a notice."""

    files: list[str] | str | None  # its file list (or how its files come), None: none
    states: dict[str, Any]  # its data iterators' positions
    notice: tuple[int, str, float] | None  # its preemption notice
    dir_name: str | None  # the checkpoint_dir_name it asked for
    validation: bool | ValidationTaskConfig  # the validation it asked for


def _checkpoint_dir_name(gathered: list[_RankShare]) -> str | None:
    """The run directory a report's checkpoint goes to: rank 0's ``checkpoint_dir_name``,
    as Ray broadcasts it; or else the directory a ``NO_UPLOAD`` checkpoint is, whichever
    rank reported it (Ray takes the first rank's checkpoint). Ranks that report
    ``NO_UPLOAD`` directories must report the same one (a ConfigError on every rank)."""
    in_place = {g.dir_name for g in gathered if g.files == IN_PLACE}
    if len(in_place) > 1:
        raise ConfigError(
            f"report(checkpoint_upload_mode=NO_UPLOAD): the ranks reported different "
            f"directories of the run ({', '.join(sorted(str(n) for n in in_place))}); every "
            "rank that reports a checkpoint must report the same one (the others None).")
    return gathered[0].dir_name if gathered[0].dir_name is not None else next(
        iter(in_place), None)


def _files_of(args: ReportArgs) -> list[str] | str | None:
    """How this rank's checkpoint files come, which the ranks share: None without a
    checkpoint (metrics alone, or with a preemption notice); ``IN_PLACE``: in the run
    directory already (``NO_UPLOAD``); ``BY_UPLOAD_FN``: the rank's
    ``checkpoint_upload_fn`` writes them; else their list (:func:`listed_files`),
    uploaded from the local directory (``ASYNC`` or ``SYNC``)."""
    checkpoint = args.checkpoint
    if checkpoint is None:
        return None
    if args.in_place:
        return IN_PLACE
    if args.upload_fn is not None:
        return BY_UPLOAD_FN
    return listed_files(checkpoint.path, checkpoint.written)


def _deleted_once_staged(args: ReportArgs) -> str | None:
    """The local directory ``report()`` deletes before it returns, its files staged (the
    staged copy is what uploads), when ``delete_local_checkpoint_after_upload`` asks for
    it; None for a directory still being written (moved into the staging area whole)
    and for one a ``checkpoint_upload_fn`` reads (deleted after it, see
    :mod:`.upload_fn`)."""
    checkpoint = args.checkpoint
    if not args.delete_local or checkpoint is None or checkpoint.written is not None \
            or args.upload_fn is not None:
        return None
    return checkpoint.path


_session: TrainSession | None = None
_session_factory: Callable[[], TrainSession] | None = None


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
        self._resumables: dict[str, Resumable] = {}
        self._live_positions: dict[str, Any] | None = None  # a live recovery's (LiveState)
        self._loader_count = 0
        self._created_at = time.time()
        self._staging_dir = staging_dir
        self._after_report = tuple(after_report)
        self._preemption: PreemptionInfo | None = None
        self._joined: JoinedSession | None = None
        self._synced: CommitManifest | None = None  # the newest SYNC commit of the attempt
        self._reported: int | None = None  # the newest checkpoint index this rank reported
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
                self._control_group(), self._staging_dir, self._created_at,
                self.spec.validation_config, self.resources.devices)
        return self._joined

    def _control_group(self) -> Any:
        """The process group of the session's collectives (see :mod:`.control_group`)."""
        return self.resources.control_group

    def _latest(self) -> CommitManifest | None:
        """The checkpoint the group would resume from now: the one the ranks restored, or
        one committed synchronously since."""
        return self._synced or self.join().restored

    # resumable iterables (dataset shards, prepared data loaders)
    def register_resumable(self, key: str, iterable: Resumable) -> None:
        """Tracks ``iterable``'s position in checkpoints and restores it now if saved (by
        a live recovery, else in the checkpoint resumed from); a resume at another world
        size is said on rank 0's console and in the run's record of the restart
        (``restores.json``)."""
        self._resumables[key] = iterable
        if self._live_positions is not None:
            if key in self._live_positions:
                self._say_resumed(key, iterable.restore(every_rank(self._live_positions[key])))
            return
        latest = self._latest()
        if latest:
            self._say_resumed(key, iterable.restore(ranks_states(latest.worker_states, key)))

    def _say_resumed(self, key: str, resumed: Resumed | None) -> None:
        if resumed is None or self.env.rank != 0:
            return
        said = resumed.describe(key)
        logger.warning("Elastic data: %s.", said)
        try:
            self.storage.note_restore_data(said)
        except StorageError:  # bookkeeping only: never fail a restart for it
            logger.warning("Could not record the data's resume in restores.json",
                           exc_info=True)

    # live recovery (elastic_train.torch.LiveState)
    def live_positions(self) -> tuple[dict[str, Any], int]:
        """This rank's data positions by key, and the reports so far: what a live copy of
        a step keeps beside the user's state."""
        return ({key: it.state_dict() for key, it in self._resumables.items()},
                self.join().rows.iteration)

    def resume_live(self, positions: dict[str, Any], iteration: int, step: int,
                    source: int, taken_at: float) -> None:
        """The group goes on from a live state (``positions`` and ``iteration`` as
        :meth:`live_positions` gave them on the rank ``source``, at ``step``, taken at
        ``taken_at``) instead of the checkpoint it joined at: data positions, the report
        count and, on rank 0, the goodput ledger follow.

        A live state is taken inside a step, so a pass it finished is resumed into its
        empty rest (the train function's own epoch counter says that epoch), not at the
        next epoch as a checkpoint reported after the loop is."""
        self._live_positions = {key: {**state, "finished": False}
                                for key, state in positions.items()}
        joined = self.join()
        joined.rows.resume_at(iteration)
        joined.clock.live_restored(iteration, step, source, taken_at)
        for key, iterable in self._resumables.items():
            self.register_resumable(key, iterable)

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
            # with its manifest, which the ranks agreed on: read again, it may be missed by
            # a listing this process cached before the commit (s3fs), and without it
            # the node's tier and its peers' copies would go unused
            return committed_checkpoint(self.storage.checkpoints.path(latest.index),
                                        self.storage.fs, latest)
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
               checkpoint_dir_name: str | None = None,
               checkpoint_upload_mode: CheckpointUploadMode | None = None,
               delete_local_checkpoint_after_upload: bool | None = None,
               checkpoint_upload_fn: Callable[[Checkpoint, str], Checkpoint] | None = None,
               validation: Any = False) -> None:
        """One report (collective; the public :func:`report`'s arguments), in five modes.
        The first round, which every report runs, tells the ranks which: metrics alone
        (most reports: nothing more to agree on), a preemption notice (the ranks share
        it), or a checkpoint, whose files come from a rank's local directory (uploaded,
        ``ASYNC`` or ``SYNC``), are in the run already (``NO_UPLOAD``), or are written by
        a ``checkpoint_upload_fn`` (see :func:`_files_of`). Rank 0's duties are its
        committer's; the after-report hooks end every report."""
        args = ReportArgs.check(metrics, checkpoint, checkpoint_dir_name,
                                checkpoint_upload_mode, delete_local_checkpoint_after_upload,
                                checkpoint_upload_fn, validation,
                                (self.storage.fs, self.storage.run_path),
                                has_validation_fn=self.spec.validation_config is not None)
        joined = self.join()
        joined.uploader.raise_if_failed()
        row = joined.rows.next(args.metrics)
        files, notice = _files_of(args), preemption.local_notice()
        any_checkpoint, any_notice, times, nodes, shared = self._first_round(
            joined, files is not None, notice is not None, self.step_clock.report_begins(),
            joined.clock.shared_numbers())
        joined.clock.waited()
        row.update(step_fields(times, [int(n) for n in nodes]))
        if any_checkpoint:
            self._before_any_upload(joined, args)
        if any_checkpoint or any_notice:  # else metrics alone: nothing more to agree on
            gathered = self._gather_shares(joined, args, files, notice, any_checkpoint)
            mode = self._agreed_mode(args.mode, gathered)
            if any_checkpoint:
                self._report_checkpoint(joined, args, gathered, row, mode)
        self._end_report(joined, row, shared, any_checkpoint)

    def _before_any_upload(self, joined: JoinedSession, args: ReportArgs) -> None:
        """Rank 0's checks once a rank has a checkpoint, before any rank uploads: the
        checkpoint's score, and the directory name asked for, claimed."""
        if joined.committer is None:  # rank 0's, whichever rank holds files
            return
        joined.committer.check_score(args.metrics, joined.numbers.next_index,
                                     validating=bool(args.validation))
        if args.dir_name is not None:
            joined.committer.claim(joined.numbers.next_index, args.dir_name,
                                   args.in_place or args.in_run)

    def _gather_shares(self, joined: JoinedSession, args: ReportArgs,
                       files: list[str] | str | None,
                       notice: tuple[int, str, float] | None,
                       any_checkpoint: bool) -> list[_RankShare]:
        """Every rank's share of a report with a checkpoint or a notice (collective), with
        its data iterators' positions when a checkpoint records them."""
        states = ({key: it.state_dict() for key, it in self._resumables.items()}
                  if any_checkpoint else {})
        return joined.group.all_gather(
            _RankShare(files, states, notice, args.dir_name, args.validation))

    def _agreed_mode(self, mode: CheckpointUploadMode, gathered: list[_RankShare]
                     ) -> CheckpointUploadMode:
        """When the report returns, agreed by all ranks: ``SYNC`` when a rank has a
        preemption notice (the node may go any moment: commit now) or a ``NO_UPLOAD``
        checkpoint (written already: the commit reads them), else the mode asked for."""
        if self._note_preemption([g.notice for g in gathered]) is not None:
            mode = CheckpointUploadMode.SYNC
        if any(g.files == IN_PLACE for g in gathered):
            mode = CheckpointUploadMode.SYNC
        return mode

    def _report_checkpoint(self, joined: JoinedSession, args: ReportArgs,
                           gathered: list[_RankShare], row: dict[str, Any],
                           mode: CheckpointUploadMode) -> None:
        """A checkpoint some rank reported: named in the run and in its row, persisted,
        and this rank's local directory deleted once staged when asked."""
        index = joined.numbers.next_index
        if (name := _checkpoint_dir_name(gathered)) is not None:
            if joined.committer is not None and args.dir_name is None:
                # Another rank's NO_UPLOAD directory: it is the checkpoint.
                joined.committer.claim(index, name, in_place=True)
            self.storage.checkpoints.names.adopt(index, name)
        row["checkpoint_dir_name"] = self.storage.checkpoints.name(index)
        # As Ray's: the validation of the first rank that reported a checkpoint.
        validation = next(g.validation for g in gathered if g.files is not None)
        self._persist_checkpoint([(g.files, g.states) for g in gathered], args.checkpoint,
                                 row, mode, args, validation)
        if (staged := _deleted_once_staged(args)) is not None:
            shutil.rmtree(staged, ignore_errors=True)

    def _end_report(self, joined: JoinedSession, row: dict[str, Any],
                    shared: list[list[float]], any_checkpoint: bool) -> None:
        """What ends every report: rank 0 records the metrics row, the after-report hooks
        run, the attempt's clock takes the report's ``shared`` numbers (see
        :mod:`.attempt_clock`), and the step clock starts the next report's step time."""
        if joined.committer is not None:
            joined.committer.record_row(row)
        for hook in self._after_report:
            hook(joined.rows.iteration, self.env)
        joined.clock.report_ends(shared, any_checkpoint, joined.rows.iteration)
        self.step_clock.report_ends()

    def _first_round(self, joined: JoinedSession, has_files: bool, has_notice: bool,
                     step_time: float, clock_numbers: tuple[float, ...] = (0.0,) * SHARED,
                     returned: bool = False
                     ) -> tuple[bool, bool, list[float], list[float], list[list[float]]]:
        """The all_reduce every ``report()`` starts with (and a returning rank's last, see
        :mod:`.even_reports`): whether any rank has checkpoint files or a preemption
        notice, each rank's step time and node, and each rank's ``clock_numbers`` (see
        :meth:`.attempt_clock.AttemptClock.shared_numbers`). A ConfigError on every rank
        when one rank returned while others report."""
        (any_files, any_notice, any_returned), (times, nodes, gone, calls, *shared) = \
            joined.group.any_rank_and_each(
                (has_files, has_notice, returned),
                (step_time, self.env.node_rank, float(returned), joined.rows.since_start,
                 *clock_numbers))
        error = uneven_reports(gone, calls) if any_returned else None
        if error is not None:
            raise error
        return any_files, any_notice, times, nodes, shared

    def returned(self) -> None:
        """The train function returned on this rank: a last round of the report's first
        collective, so that a rank still in ``report()`` learns of it, and every rank
        fails naming the uneven calls (see :mod:`.even_reports`). Skipped when the train
        function destroyed the process group itself."""
        if self._joined is not None and (self.env.world_size == 1 or dist.is_initialized()):
            self._first_round(self._joined, False, False, 0.0, returned=True)

    def _persist_checkpoint(self, gathered: list[tuple[list[str] | str | None, dict]],
                            checkpoint: Checkpoint | None, row: dict[str, Any],
                            mode: CheckpointUploadMode, args: ReportArgs,
                            validation: bool | ValidationTaskConfig = False) -> None:
        """Each file goes up from the lowest rank that has it (or by the rank's
        ``checkpoint_upload_fn``, on the upload thread: :mod:`.upload_fn`); rank 0 commits
        after all, and then has the checkpoint validated when ``validation`` asks for it."""
        joined = self.join()
        index = self._reported = joined.numbers.reserve()
        task = (self.spec.validation_config.task(validation)
                if validation and self.spec.validation_config is not None else None)
        manifest = (joined.committer.manifest(index, row, [states for _, states in gathered],
                                              task)
                    if joined.committer is not None else None)
        job = UploadJob.plan(index, [files for files, _ in gathered], self.env.rank, manifest)
        if args.upload_fn is not None and checkpoint is not None:
            job.write = by_upload_fn.writer(args.upload_fn, checkpoint, self.storage.checkpoints,
                                            index, args.delete_local)
        joined.uploader.submit(job, checkpoint.path if checkpoint is not None else None,
                               checkpoint.written if checkpoint is not None else None)
        if mode is CheckpointUploadMode.SYNC:
            errors = joined.group.all_gather(joined.uploader.wait_for(index))
            if errors[self.env.rank]:
                joined.uploader.raise_if_failed()  # this rank's own, of the type it had
            errors = [e for e in errors if e]
            if errors:
                raise StorageError(f"{self.storage.display_path}: {'; '.join(errors)}")
            self._synced = CommitManifest(index, joined.rows.iteration, row, {},
                                          self.env.world_size)

    def get_all_reported_checkpoints(
            self, consistency_mode: CheckpointConsistencyMode = CheckpointConsistencyMode.VALIDATED,
            timeout_s: float | None = None) -> list[ReportedCheckpoint]:
        """The run's committed checkpoints once this rank's reports are committed (see
        :mod:`.reported_checkpoints`); not collective."""
        deadline = checked_wait(consistency_mode, timeout_s)
        if self._joined is not None and self._reported is not None:
            committed = wait_until_committed(self.storage.checkpoints, self._reported,
                                             self._joined.uploader.raise_if_failed, deadline)
            if committed and CheckpointConsistencyMode(
                    consistency_mode) is CheckpointConsistencyMode.VALIDATED:
                wait_until_validated(self.storage.checkpoints, deadline)
        return reported_checkpoints(self.storage.checkpoints,
                                    self.spec.run_config.checkpoint_config)

    def finish(self) -> None:
        """Waits for pending uploads and commits (the run ends only when they are
        stored), then, on rank 0, for the validations asked for (as Ray's controller
        waits for them before it shuts down); the wait is checkpoint time in the
        goodput ledger."""
        if self._joined is not None:
            began = time.monotonic()
            self._joined.uploader.close()
            if (committer := self._joined.committer) and committer.validations is not None:
                committer.validations.close()
            self._joined.clock.finish(time.monotonic() - began, self._joined.rows.iteration)

    def should_checkpoint(self, prior_mtbf_s: float) -> bool:
        """The public :func:`should_checkpoint` (see :mod:`.attempt_clock`)."""
        return self.join().clock.should_checkpoint(prior_mtbf_s)

    def uploads_in_flight(self) -> bool:
        """Whether a reported checkpoint of this rank is not uploaded (and, on rank 0,
        committed) yet."""
        return self._joined is not None and self._joined.uploader.in_flight()

    def end_failed_attempt(self, finish_s: float) -> None:
        """Ends a failed attempt's session (in-process restarts), after finishing the
        uploads in flight -- this rank's files, and on rank 0 the commits, which wait
        for the other ranks' files -- for up to ``finish_s`` seconds (the agent's
        verdict, see :class:`~elastic_train.worker.inprocess.channel.Verdict`). What is not
        finished by then is dropped, as if the process had died: the next attempt
        resumes from what is committed. ``finish_s`` is inf when the run stops after
        this attempt: a checkpoint every rank reported is kept although a rank failed
        after reporting it (an upload error is logged: the run has failed already). A
        session that never joined (the attempt failed before its first call that needs
        the other ranks) has nothing to finish or drop."""
        joined = self._joined
        if joined is None:
            return
        joined.clock.close()
        if joined.committer is not None and joined.committer.validations is not None:
            # Killed, left pending: the next attempt (or a restore) validates them again.
            joined.committer.validations.abandon()
        try:
            if finish_s > 0 and joined.uploader.finish(finish_s):
                return
        except StorageError as exc:
            logger.error("The checkpoint in flight when the attempt failed was not "
                         "stored: %s", exc)
            return
        if finish_s > 0:
            logger.warning("The checkpoint in flight when the attempt failed was not "
                           "stored within %gs; the next attempt resumes from the last "
                           "one committed.", finish_s)
        if joined.committer is not None:
            joined.committer.cancel()
        joined.uploader.abandon()


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
            "get_dataset_shard() work only inside a train function run by a trainer "
            "(TorchTrainer(train_fn, ...).fit()), or in a script started with "
            "`elastic-train launch SCRIPT` -- not with plain `python SCRIPT`."
        )
    return _session


def report(metrics: dict[str, Any], checkpoint: Checkpoint | None = None,
           checkpoint_dir_name: str | None = None,
           checkpoint_upload_mode: CheckpointUploadMode | None = None,
           delete_local_checkpoint_after_upload: bool | None = None,
           checkpoint_upload_fn: Callable[[Checkpoint, str], Checkpoint] | None = None,
           validation: Any = False) -> None:
    """Reports metrics (and optionally a checkpoint) from this worker (Ray 2.60's
    arguments, in Ray's order).

    Every rank must call it the same number of times. Rank 0's metrics are recorded;
    the checkpoint files of every rank that passes one are merged into one committed
    checkpoint. See :class:`CheckpointUploadMode` for when the call returns (our
    default, None, is ASYNC; Ray v2's is SYNC). A checkpoint whose files are still being
    written (``Checkpoint.from_directory(d, written=future)``, e.g. from
    ``dcp.async_save``) does not wait for them: they go up once written.

    ``delete_local_checkpoint_after_upload`` deletes the reported directory once its
    files are staged, before ``report()`` returns (Ray: once uploaded; the staged copy is
    what uploads, so a next checkpoint written into the same directory never races the
    deletion); like Ray's, it wants each rank to report a directory of its own. Its
    default is Ray's, True for an ASYNC passed explicitly; left out, the mode is our
    ASYNC where Ray's is SYNC, so the directory is kept (a Ray script that removes it
    after ``report()`` ports unchanged). A directory still being written (``written=``)
    is moved into the staging area whatever the argument says.

    ``checkpoint_dir_name`` names the checkpoint's directory in the run (default
    ``checkpoint_NNNNNN``; rank 0's is used, as in Ray): one plain name, unique in the
    run -- a name with ``/``, starting with ``.``, of the default form, or taken already
    is a ConfigError before anything is uploaded. The checkpoint keeps its number, which
    still orders retention and resume (see :mod:`elastic_train.storage.checkpoint_names`).
    A ``NO_UPLOAD`` checkpoint (see :class:`CheckpointUploadMode`) is a directory of
    the run, named by it (a path anywhere else is refused); a commit cut short leaves
    its files where they are.

    ``checkpoint_upload_fn(checkpoint, dir_name)`` (Ray's) writes the rank's files
    into ``<run>/<dir_name>`` itself and returns ``Checkpoint`` of it (else a
    ConfigError). As in Ray, it runs in the background under ASYNC (on the rank's upload
    thread: it may wait for a ``dcp.async_save`` future), before ``report()`` returns
    under SYNC; the commit reads each file once for its size and CRC-32. A checkpoint
    reported from a directory of the run (Ray's guide: ``async_save`` into
    ``get_storage().build_checkpoint_path_from_name(n)``) is named after it and never
    deleted: it is the checkpoint (Ray's ASYNC default would delete it).

    ``validation`` (Ray's): True, or a ``ValidationTaskConfig`` whose ``fn_kwargs``
    override the trainer's ``ValidationConfig`` defaults, validates the checkpoint
    once committed, in a process of its own on rank 0's node, while training goes on
    (see :mod:`.validation_runner`); what the function returns is merged into the
    checkpoint's metrics row. As in Ray, it needs a checkpoint on the rank that passes
    it (ranks without one pass False) and a trainer with ``validation_config``.

    Example::

        with tempfile.TemporaryDirectory() as d:
            torch.save(model.state_dict(), os.path.join(d, "model.pt"))
            elastic_train.report({"loss": loss}, Checkpoint.from_directory(d))
    """
    get_session().report(metrics, checkpoint, checkpoint_dir_name, checkpoint_upload_mode,
                         delete_local_checkpoint_after_upload, checkpoint_upload_fn,
                         validation)


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


def should_checkpoint(prior_mtbf_s: float = PRIOR_MTBF_S) -> bool:
    """Whether this report should carry a checkpoint, by Young/Daly (opt-in; our addition).

    True when the training time since the last checkpoint reaches, by the next
    ``report()``, the interval ``sqrt(2 * C * MTBF)`` that loses the least time: ``C``
    is this job's own measured save cost (the slowest rank's time from this function's
    True to the end of the report that carried the checkpoint: your save and the
    upload ``report()`` waited for), ``MTBF`` the run's wall time over the failures it
    saw, or ``prior_mtbf_s`` (seconds > 0, one hour by default; a text such as "4h" is a
    ConfigError) until it saw one. True until a save
    was measured (the first checkpoint measures it), False before this attempt's first
    report once one was.

    Every rank gets the same answer without a collective of its own, so any rank may
    ask, provided every rank asks at the same place with the same ``prior_mtbf_s``: it
    reads only what the ranks share (the run's history, agreed as the attempt began,
    and what the previous ``report()``'s collective carried). Ask right before saving:
    the time from a True to the report counts as the save's. ``elastic-train show``
    prints the interval the run used beside the optimum (see docs/observability.md).

    Example::

        for step, batch in enumerate(loader):
            loss = train_step(batch)
            checkpoint = None
            if elastic_train.should_checkpoint():
                checkpoint = save(model, optimizer)  # your Checkpoint.from_directory(...)
            elastic_train.report({"loss": loss}, checkpoint=checkpoint)
    """
    mtbf = seconds(prior_mtbf_s, "should_checkpoint's prior_mtbf_s", example="14400")
    return get_session().should_checkpoint(mtbf)


def get_checkpoint() -> Checkpoint | None:
    """The latest committed checkpoint of this run, or the trainer's
    ``resume_from_checkpoint`` on a fresh run, or None."""
    return get_session().get_checkpoint()


def get_all_reported_checkpoints(
        consistency_mode: CheckpointConsistencyMode = CheckpointConsistencyMode.VALIDATED,
        timeout_s: float | None = None) -> list[ReportedCheckpoint]:
    """The run's checkpoints that retention kept, plus the latest, each with the
    metrics row reported with it (Ray 2.60's function).

    Waits until every checkpoint this rank reported is committed (``COMMITTED``), and
    with ``VALIDATED``, the default, until no checkpoint waits for its asynchronous
    validation either; or until ``timeout_s`` passed -- then it lists what is there,
    as Ray does. Each one's ``status`` says how its validation stands.
    Not collective: any rank may call it any number of times. The list is in Ray's
    order: by report, or worst to best with ``CheckpointConfig.checkpoint_score_attribute``.

    Example::

        for reported in elastic_train.get_all_reported_checkpoints():
            mlflow.log_metric("loss", reported.metrics["loss"])
    """
    return get_session().get_all_reported_checkpoints(consistency_mode, timeout_s)


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
