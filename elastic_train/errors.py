"""Every exception the project raises, in one module.

Workers' errors reach the driver whole: :class:`WorkerFailure` carries the
rank, the exit code or signal and the worker's own traceback, and
:class:`TrainingFailedError` presents them with the run's path and the way to
resume.
"""

from __future__ import annotations

from dataclasses import dataclass

from elastic_train._internal.redaction import redact_url


class ConfigError(ValueError):
    """A setting or input is invalid; raised in the driver before any process starts.

    ``field``: the config field at fault (``"FailureConfig.max_failures"``), when one
    is; a front-end names it its own way (``launch``: the flag or variable it came from).
    """

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class StorageError(RuntimeError):
    """The run's storage could not be read or written."""


class StorageFullError(StorageError):
    """The run's storage has no space left (ENOSPC) or its quota is spent (EDQUOT): no
    retry helps until someone frees space. Its message names the file and the way out."""


class CorruptManifestError(ValueError):
    """A checkpoint's commit marker is not one elastic-train wrote: malformed, or naming a
    file outside the checkpoint. Readers treat the checkpoint as damaged (an older one is
    resumed from) and write nothing it names."""


class RunInUseError(ConfigError):
    """Another job is writing the run directory: refused before any process starts.

    Two jobs writing one run would remove each other's uploads as unfinished and
    commit checkpoints under the same numbers (see :mod:`elastic_train.driver.run_lease`).
    """


class LeaseLostError(StorageError):
    """This job's lease on the run was taken over by another job: it writes no more.

    Raised before a commit, upload, deletion or cleanup (the fencing check of
    :class:`elastic_train.storage.lease.LeaseFence`).
    """


@dataclass(frozen=True)
class WorkerFailure:
    """One failed worker process, as the agent observed it.

    ``exitcode`` is negative when the process was killed by a signal
    (``-9`` for SIGKILL), as in ``subprocess``. ``config_error``: it raised a
    :class:`ConfigError` (a mistake in the run's settings, which a restart would meet
    again: never retried). ``hung``: the hang watch stopped it (SIGKILL) for making no
    progress; ``message`` is its verdict (the ``HangError``: for how long, stuck where).
    """

    rank: int
    local_rank: int
    pid: int
    exitcode: int
    message: str
    traceback: str | None
    hostname: str = ""
    timestamp: float = 0.0  # when it failed (torch's record: the error file's, or detection)
    config_error: bool = False
    hung: bool = False

    @property
    def signal_name(self) -> str | None:
        """The signal's name (``"SIGKILL"``) when a signal ended the process."""
        if self.exitcode >= 0:
            return None
        import signal

        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"

    @property
    def without_exception(self) -> bool:
        """The process exited with an error code but left neither an exception nor a
        message (``os._exit(1)``, a crash in native code that exits)."""
        return self.exitcode > 0 and not self.traceback and not self.message

    def describe(self) -> str:
        """One line: which rank ended how."""
        if self.hung:
            how = "hung and was stopped by the hang watch"
        elif self.signal_name:
            how = f"was killed by {self.signal_name}"
        else:
            how = f"exited with code {self.exitcode}"
        if self.without_exception:
            how += " without a Python exception"
        where = f" on {self.hostname}" if self.hostname else ""
        return f"rank {self.rank} (local rank {self.local_rank}, pid {self.pid}{where}) {how}"

    def verdict(self) -> list[str]:
        """The lines that say why the agent stopped it, before its traceback: a hang's
        ``HangError`` (its traceback is the stack it was stuck in)."""
        return ["", self.message] if self.hung and self.message else []

    @classmethod
    def from_json(cls, data: dict) -> WorkerFailure:
        """The inverse of :meth:`to_json` (``signal`` is derived, so it is not read)."""
        return cls(rank=int(data["rank"]), local_rank=int(data.get("local_rank", 0)),
                   pid=int(data.get("pid", 0)), exitcode=int(data["exitcode"]),
                   message=str(data.get("message", "")), traceback=data.get("traceback"),
                   hostname=str(data.get("hostname", "")),
                   timestamp=float(data.get("timestamp", 0.0)),
                   config_error=bool(data.get("config_error", False)),
                   hung=bool(data.get("hung", False)))

    def to_json(self) -> dict:
        return {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "pid": self.pid,
            "exitcode": self.exitcode,
            "signal": self.signal_name,
            "message": self.message,
            "traceback": self.traceback,
            "hostname": self.hostname,
            "timestamp": self.timestamp,
            "config_error": self.config_error,
            "hung": self.hung,
        }


class TrainingFailedError(RuntimeError):
    """The run failed after spending its restart budget.

    Mirrors ``ray.train.base_trainer.TrainingFailedError``. ``failures`` lists
    the workers that failed in the last attempt, root cause first.
    """

    def __init__(self, message: str, failures: list[WorkerFailure] | None = None,
                 run_path: str | None = None):
        super().__init__(message)
        self.failures = list(failures or [])
        self.run_path = run_path

    @classmethod
    def from_failures(cls, failures: list[WorkerFailure], run_path: str, max_failures: int,
                      resume_hint: str = "run fit() again with the same "
                                         "RunConfig(name=..., storage_path=...)",
                      retry_hint: str = "set RunConfig(failure_config=FailureConfig("
                                        "max_failures=N)) with N > 0, or -1 for unlimited "
                                        "retries",
                      retry_helps: bool = True) -> TrainingFailedError:
        """Builds the user-facing message: root cause, its traceback, how to resume.

        ``retry_helps``: False for an exception raised before the run made any progress
        (the first step of the first attempt): a retry would raise it again, so the
        message says to fix it rather than how to retry."""
        root = failures[0]
        lines = [f"Training failed: {root.describe()}."] + root.verdict()
        if root.traceback:
            lines += ["", f"Traceback of rank {root.rank}:", root.traceback.rstrip()]
        elif root.message:
            lines += ["", root.message]
        for other in failures[1:]:
            lines.append(f"Also failed: {other.describe()}.")
        lines += [
            "",
            f"Run directory: {run_path}",
            f"To continue this run from its latest checkpoint, {resume_hint}.",
        ]
        if cls is PreemptionError:
            lines.append(f"The preemption budget (max_preemption_failures={max_failures}) is "
                         "spent: the job's nodes were preempted more often than that.")
        elif root.config_error:
            lines.append(f"Rank {root.rank} raised a ConfigError, a mistake in the run's "
                         "settings that a restart would meet again: it was not retried "
                         "(the restart budget is left as it was). Fix what it names first.")
        elif max_failures == 0 and not retry_helps:
            lines.append(f"Rank {root.rank}'s error came before the run's first report(), "
                         "in its first attempt: a retry would most likely meet it again, so "
                         "fix it first (automatic retries help with failures that pass: a "
                         "lost node, a preemption, a storage outage).")
        elif max_failures == 0:
            lines.append(f"To retry automatically, {retry_hint}.")
        else:
            lines.append(f"The restart budget (max_failures={max_failures}) is spent.")
        return cls("\n".join(lines), failures=failures, run_path=run_path)


class PreemptionError(TrainingFailedError):
    """The run stopped because its nodes were preempted more often than allowed.

    Mirrors ``ray.train.PreemptionError``: preemptions spend
    ``FailureConfig.max_preemption_failures``, not ``max_failures``.
    """


NO_PROGRESS_EXIT_CODE = 3


class NoProgressError(TrainingFailedError):
    """The run stopped because its restarts brought no progress (our addition; Ray has none).

    Raised when ``FailureConfig.max_restarts_without_progress`` consecutive
    restarts ended without a new committed checkpoint and without a report past
    the furthest iteration reached -- whatever is left of ``max_failures``, so
    that a failure that repeats does not loop forever. ``reason`` is one line
    naming the repeating failure. ``elastic-train launch`` and ``restore`` exit
    with :data:`exit_code` (3) for it, so a scheduler can tell it apart: e.g. a
    Kubernetes Job's ``podFailurePolicy`` rule ``action: FailJob`` on exit code 3,
    or leaving 3 out of Slurm's ``RequeueExit``.
    """

    exit_code = NO_PROGRESS_EXIT_CODE

    def __init__(self, message: str, failures: list[WorkerFailure] | None = None,
                 run_path: str | None = None, reason: str = ""):
        super().__init__(message, failures=failures, run_path=run_path)
        self.reason = reason

    @classmethod
    def stopped(cls, reason: str, failures: list[WorkerFailure], run_path: str,
                resume_hint: str, guard_hint: str) -> NoProgressError:
        """The message: the reason first (one line), then the last failure's traceback;
        ``guard_hint`` says how to turn the guard off, in the front-end's terms."""
        root = failures[0]
        lines = [f"Training stopped: {reason}.", "",
                 f"The last failure: {root.describe()}.", *root.verdict()]
        if root.traceback:
            lines += [f"Traceback of rank {root.rank}:", root.traceback.rstrip()]
        elif root.message:
            lines.append(root.message)
        lines += ["", f"Run directory: {run_path}",
                  f"Fix the failure, then to continue from the latest checkpoint, {resume_hint}.",
                  f"To turn this guard off, {guard_hint}."]
        return cls("\n".join(lines), failures=failures, run_path=run_path, reason=reason)


class NodeLeftError(TrainingFailedError):
    """This node left the job on its node policy's word (our addition; Ray has none).

    Raised when the policy (:mod:`elastic_train.agent.node_policy`) sent the node away
    after a failure charged to it, or did not admit it to a round. The node stops its
    workers without closing the rendezvous: the other nodes go on without it.
    ``node`` is its name, ``reason`` the policy's, ``cool_off_s`` how long it is kept
    out of the job (0: it may join again at once): recorded in the run directory, the
    node is refused for that long even if its agent is started again
    (:mod:`elastic_train._internal.departures`).
    """

    def __init__(self, node: str, reason: str, cool_off_s: float = 0.0,
                 failures: list[WorkerFailure] | None = None, run_path: str | None = None):
        cool_off = (f" It is not admitted again for {cool_off_s:g} s of cooling off, even if "
                    "its agent is started again." if cool_off_s else "")
        super().__init__(f"Node {node} left the job: {reason}.{cool_off} The job's other "
                         "nodes, if any, go on without it.", failures=failures,
                         run_path=run_path)
        self.node, self.reason, self.cool_off_s = node, reason, cool_off_s


class RendezvousLostError(TrainingFailedError):
    """This node can no longer reach the job's rendezvous, so it cannot re-form the job.

    With c10d this is what the loss of the node hosting the store looks like to
    the others: torch has no fail-over for that store (use etcd instead).
    """

    @classmethod
    def for_backend(cls, backend: str, endpoint: str, cause: BaseException,
                    node_store: bool) -> RendezvousLostError:
        """``node_store``: the endpoint is a TCP store a node of the job hosted (c10d)."""
        if node_store:
            why = (f"the c10d store at {endpoint} is unreachable: the node hosting it (the "
                   "first to bind the endpoint) is gone, and with c10d no other node can take "
                   "its place. For jobs that must survive the loss of any node, use etcd "
                   "(--rdzv-backend etcd, or RendezvousConfig(backend='etcd')).")
        else:
            why = (f"the {backend} rendezvous at {endpoint} stayed unreachable for longer "
                   "than its outage_timeout (--rdzv-conf outage_timeout=SECONDS), or what "
                   "answers there is no etcd v3 server.")
        return cls(redact_url(f"This node lost the job's rendezvous: {why} ({cause}) Start "
                              "every node again to resume the run from its latest checkpoint."))

    @classmethod
    def corrupt_state(cls, backend: str, endpoint: str, run_id: str, cause: BaseException,
                      etcd_prefix: str = "") -> RendezvousLostError:
        """The job's rendezvous state cannot be read: every node stops rather than guess
        (a round number or membership made up by one node could pair its workers with
        another round's). Nothing of the run is lost; the fix depends on where the state
        lives: ``etcd_prefix``, the run's keys in etcd, for the etcd backends."""
        if etcd_prefix:
            fix = (f"Delete the run's keys (etcdctl --endpoints {endpoint} del --prefix "
                   f"{etcd_prefix}), or give the job a new --rdzv-id, then start every "
                   "node again.")
        else:
            fix = f"Start every node again: the {backend} rendezvous starts anew with them."
        return cls(redact_url(
            f"The job's rendezvous state (rendezvous id {run_id}, {backend} at {endpoint}) "
            f"is corrupt: {str(cause).rstrip('.')}. Something other than this job's nodes "
            "wrote it. The job stopped; its checkpoints are intact and a restart resumes "
            f"from the latest. {fix}"))


def exit_code(error: TrainingFailedError) -> int:
    """The exit code of ``elastic-train launch``/``restore`` for a run that failed: 3 when
    it stopped without progress (:class:`NoProgressError`), else 1."""
    return error.exit_code if isinstance(error, NoProgressError) else 1
