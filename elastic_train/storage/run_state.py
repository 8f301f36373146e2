"""``run.json`` and ``restores.json`` as typed records: what a run directory says of its run,
and the names of the run directory's own entries (:data:`RUN_ENTRIES`).

The driver writes them (:mod:`elastic_train.driver.run_record`, rank 0's
session for restores); ``elastic-train ls``/``show``, ``Result`` and restore
read them. Every record reads the JSON of older versions (missing fields get
their defaults) and writes the same field names as before, so a run directory
stays readable across versions.

The run directory, ``<storage_path>/<name>/``::

    run.json           spec, status, attempts and failures (written by the driver only)
    trainable.pkl      the train function and settings, pickled (for restore)
    metrics.jsonl      one line per report() of rank 0 (on a store without append, S3:
    metrics.jsonl.d/   numbered segments instead, see :mod:`.jsonl_log`)
    restores.json      one entry per start that resumed
    checkpoint_NNNNNN/ committed checkpoints, or the name a report chose
                       (see :mod:`.checkpoint_store`, :mod:`.checkpoint_names`)
    logs/              per-rank logs
    departures/        nodes that left on their node policy's word (one JSON file each)
    goodput/           the goodput ledger: where the run's time went (one file per writer,
                       see :mod:`elastic_train.goodput.breakdown`)
    progress.csv       CSVLoggerCallback's table of the metrics
    tensorboard/       TensorBoardLoggerCallback's event files
    .<anything>        the run's bookkeeping (claims, upload markers, checkpoints set
                       aside as damaged, probes)

A checkpoint may take any other plain name (``report(checkpoint_dir_name=)``): the
names of :data:`RUN_ENTRIES` are refused there, so that a checkpoint never takes the
place of one of these entries, nor one of them the place of a checkpoint.

Example::

    state = storage.read_run_state()
    if state is not None and state.status is RunStatus.FAILED:
        print(state.failures[-1].root.describe())
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any

from elastic_train._internal.departures import DIRECTORY as DEPARTURES_DIR
from elastic_train._internal.departures import Departure
from elastic_train._internal.failure_kinds import FailureKind
from elastic_train.errors import WorkerFailure
from elastic_train.stragglers import Straggler

RUN_FILE = "run.json"
TRAINABLE_FILE = "trainable.pkl"
METRICS_FILE = "metrics.jsonl"
METRICS_SEGMENTS_DIR = METRICS_FILE + ".d"  # (the layout: :mod:`.jsonl_log`)
RESTORES_FILE = "restores.json"
LOGS_DIR = "logs"
PROGRESS_FILE = "progress.csv"
TENSORBOARD_DIR = "tensorboard"
GOODPUT_DIR = "goodput"  # (its files: :mod:`.ledger_file`)

RUN_ENTRIES = frozenset({RUN_FILE, TRAINABLE_FILE, METRICS_FILE, METRICS_SEGMENTS_DIR,
                         RESTORES_FILE, LOGS_DIR, DEPARTURES_DIR, PROGRESS_FILE,
                         TENSORBOARD_DIR, GOODPUT_DIR})


class RunStatus(str, enum.Enum):
    """Where a run stands. ``FINISHED`` is final; the others can be continued."""

    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    UNKNOWN = "unknown"  # a run.json without a status (never written by us)


@dataclass
class LaunchRecord:
    """One start of the run's driver (a ``fit()``, ``launch`` or restore), or the driver
    of another node taking the record of a launch over.

    ``recorder``: in a job that may have several nodes, the address of the recording
    driver's beacon (:class:`elastic_train.agent.node_liveness.Beacon`), which answers
    while that driver is there: another node records the launch only once it is not
    (see :class:`elastic_train.driver.supervisor.RunSupervisor`).
    """

    started: float
    pid: int
    host: str
    status: RunStatus = RunStatus.RUNNING
    ended: float | None = None
    recorder: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LaunchRecord:
        return cls(started=float(data.get("started", 0.0)), pid=int(data.get("pid", 0)),
                   host=str(data.get("host", "?")),
                   status=RunStatus(data.get("status", RunStatus.UNKNOWN.value)),
                   ended=data.get("ended"), recorder=data.get("recorder"))

    def to_json(self) -> dict[str, Any]:
        data = {**asdict(self), "status": self.status.value}
        for unset in ("ended", "recorder"):
            if data[unset] is None:
                del data[unset]
        return data


IN_PROCESS = "in-process"  # the surviving workers ran the train function again
NEW_PROCESSES = "new processes"  # the whole group was started again


@dataclass
class FailureRecord:
    """One failed attempt of the worker group, root cause first in ``workers``.

    ``failed_at``: when the first worker failed; ``time``: when the agent saw it;
    ``rendezvous_at``: when the group had formed again (None until then, or for
    the last failure of a run that stopped). ``restart``: how the group restarted,
    :data:`IN_PROCESS` or :data:`NEW_PROCESSES` (None: it did not, or not yet);
    ``replaced``: after an in-process restart, the ranks that got a new process
    (rank -> why).
    """

    time: float
    failed_at: float
    restarts_left: int
    kind: FailureKind
    workers: list[WorkerFailure]
    rendezvous_at: float | None = None
    restart: str | None = None
    replaced: dict[int, str] = field(default_factory=dict)

    @property
    def root(self) -> WorkerFailure:
        """The worker whose failure is the cause."""
        return self.workers[0]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FailureRecord:
        return cls(time=float(data["time"]), failed_at=float(data.get("failed_at", data["time"])),
                   restarts_left=int(data.get("restarts_left", 0)),
                   kind=FailureKind(data.get("kind", FailureKind.FAILURE.value)),
                   workers=[WorkerFailure.from_json(w) for w in data.get("workers", [])],
                   rendezvous_at=data.get("rendezvous_at"), restart=data.get("restart"),
                   replaced={int(k): v for k, v in data.get("replaced", {}).items()})

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"time": self.time, "failed_at": self.failed_at,
                                "restarts_left": self.restarts_left, "kind": self.kind.value,
                                "workers": [w.to_json() for w in self.workers]}
        if self.rendezvous_at is not None:
            data["rendezvous_at"] = self.rendezvous_at
        if self.restart is not None:
            data["restart"] = self.restart
        if self.replaced:
            data["replaced"] = {str(k): v for k, v in self.replaced.items()}
        return data


@dataclass
class RunState:
    """``run.json``: the run's spec, its launches, failures and status.

    ``spec`` is what the front-end recorded of the run (``fit()``: the train
    function, configs; ``launch``: the command, flags), compared on resume by
    :mod:`elastic_train.driver.resume_rules`. ``no_progress``: the one-line reason
    when the run stopped because its restarts brought no progress.
    ``zygote_errors``: each worker zygote that failed to start (``time``, ``forked``:
    from the driver or as a new interpreter, ``error``: its traceback); its workers
    started as new interpreters instead (see :mod:`elastic_train.agent.zygote.server`).
    ``stragglers``: each node named slow (see :mod:`elastic_train.stragglers`).
    ``departures``: each node that left the job on its node policy's word, and for how
    long it is kept out (see :mod:`elastic_train._internal.departures`).
    """

    name: str = ""
    created: float = 0.0
    status: RunStatus = RunStatus.UNKNOWN
    updated: float = 0.0
    spec: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    launches: list[LaunchRecord] = field(default_factory=list)
    failures: list[FailureRecord] = field(default_factory=list)
    error: str | None = None
    no_progress: str | None = None
    zygote_errors: list[dict[str, Any]] = field(default_factory=list)
    stragglers: list[Straggler] = field(default_factory=list)
    departures: list[Departure] = field(default_factory=list)

    @property
    def is_finished(self) -> bool:
        return self.status is RunStatus.FINISHED

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunState:
        return cls(name=str(data.get("name", "")), created=float(data.get("created", 0.0)),
                   status=RunStatus(data.get("status", RunStatus.UNKNOWN.value)),
                   updated=float(data.get("updated", 0.0)), spec=dict(data.get("spec", {})),
                   versions=dict(data.get("versions", {})),
                   launches=[LaunchRecord.from_json(x) for x in data.get("launches", [])],
                   failures=[FailureRecord.from_json(x) for x in data.get("failures", [])],
                   error=data.get("error"), no_progress=data.get("no_progress"),
                   zygote_errors=list(data.get("zygote_errors", [])),
                   stragglers=[Straggler.from_json(x) for x in data.get("stragglers", [])],
                   departures=[Departure.from_json(x) for x in data.get("departures", [])])

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": self.name, "created": self.created, "status": self.status.value,
            "updated": self.updated, "spec": self.spec, "versions": self.versions,
            "launches": [x.to_json() for x in self.launches],
            "failures": [x.to_json() for x in self.failures]}
        if self.error is not None:
            data["error"] = self.error
        if self.no_progress is not None:
            data["no_progress"] = self.no_progress
        if self.zygote_errors:
            data["zygote_errors"] = self.zygote_errors
        if self.stragglers:
            data["stragglers"] = [x.to_json() for x in self.stragglers]
        if self.departures:
            data["departures"] = [x.to_json() for x in self.departures]
        return data


@dataclass
class RestoreRecord:
    """One entry of ``restores.json``: a start that resumed (after a failure or a
    relaunch), when its group was ready, and the work it redoes."""

    time: float
    restored_iteration: int
    recomputed_iterations: int
    recomputed_s: float
    data: tuple[str, ...] = ()  # what a resume at another world size did to the data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RestoreRecord:
        return cls(time=float(data["time"]), restored_iteration=int(data["restored_iteration"]),
                   recomputed_iterations=int(data.get("recomputed_iterations", 0)),
                   recomputed_s=float(data.get("recomputed_s", 0.0)),
                   data=tuple(str(d) for d in data.get("data", ())))

    def to_json(self) -> dict[str, Any]:
        entry = asdict(self)
        entry["data"] = list(self.data)
        if not self.data:
            del entry["data"]  # a restart at the same world size: as before it existed
        return entry
