"""How a node's agent and its workers agree on in-process restarts: small files, one writer each.

The agent gives every worker a directory (``ELASTIC_TRAIN_INPROCESS_DIR``).
Each worker writes its own ``rank<R>.json``; the agent writes ``verdict.json``
and ``go.json``. All are replaced atomically, so a reader never sees half a record.
When the job's membership changes, the agent clears the directory while every
worker waits, and its ``go.json`` names the worker's new rank (:class:`NewWorld`).

A worker's record says where it stands in which attempt:

- ``running``: it runs the train function of attempt ``attempt``. Written
  before the train function is entered, it also tells the agent that this
  worker can restart in process (a script under ``launch`` without the
  wrapper never writes one, and keeps torchrun's restarts).
- ``failed``: its train function raised in ``attempt``; ``failure`` holds the
  error. The worker has already torn down its process group, which releases
  peers blocked in a collective with it.
- ``ready``: it has left attempt ``attempt - 1`` and released what that
  attempt held; it waits for ``go.json`` to name ``attempt``.
- ``unhealthy``: it left the attempt but cannot run another in this process
  (a CUDA error that sticks to the context); the agent replaces it.
- ``stopped``: the run ends with attempt ``attempt`` (no restart is left); the
  worker finished the checkpoint uploads it had in flight and waits to be stopped.

Once it has charged a failed attempt, the agent writes its *verdict* for it
(:class:`Verdict`: another attempt follows, or the run stops). A worker that
left the attempt with a checkpoint upload in flight waits for the verdict: on
a stop it finishes the upload -- the last checkpoint the run reported is not
lost because another rank failed after reporting it. On a restart it finishes
it too, within the verdict's ``finish_s``, when every process of the attempt
lives (a rank raised): the next attempt resumes from the checkpoint reported
right before the error, as under a synchronous upload. When a process died or
a node is gone, it drops the upload (the next attempt resumes from what is
committed).

The agent interrupts a running worker with :data:`ABORT_SIGNAL`, which the
worker turns into :class:`~elastic_train.worker.inprocess.loop.RestartAttempt`.
"""

from __future__ import annotations

import enum
import json
import os
import signal
import time
from dataclasses import asdict, dataclass

from elastic_train._internal import env_vars
from elastic_train.storage import filesystem as fsutil

ABORT_SIGNAL = signal.SIGUSR2  # the agent's "leave this attempt" (relayed by the zygote client)
GO_FILE = "go.json"
VERDICT_FILE = "verdict.json"


class Stage(str, enum.Enum):
    """Where a worker stands in its current attempt."""

    RUNNING = "running"
    FAILED = "failed"
    READY = "ready"
    UNHEALTHY = "unhealthy"
    STOPPED = "stopped"


@dataclass(frozen=True)
class FailureNote:
    """A worker's own error, as its agent records it.

    ``primary``: the error did not come out of a torch.distributed call -- the
    worker failed by itself, not because a peer vanished from a collective.
    ``exitcode``: the code the process would have exited with (``sys.exit(3)``: 3).
    ``config_error``: the error is a ``ConfigError`` (never retried).
    """

    message: str
    traceback: str
    primary: bool
    timestamp: float
    exitcode: int = 1
    config_error: bool = False


@dataclass(frozen=True)
class WorkerRecord:
    """One worker's ``rank<R>.json``."""

    attempt: int
    stage: Stage
    pid: int
    failure: FailureNote | None = None

    def to_json(self) -> dict:
        return {**asdict(self), "stage": self.stage.value}

    @classmethod
    def from_json(cls, data: dict) -> WorkerRecord:
        failure = data.get("failure")
        return cls(attempt=int(data["attempt"]), stage=Stage(data["stage"]),
                   pid=int(data["pid"]), failure=FailureNote(**failure) if failure else None)


@dataclass(frozen=True)
class NewWorld:
    """The node's place in the world a new rendezvous round formed (the job's membership
    changed): what torch would give new workers in their environment. Worker
    ``LOCAL_RANK`` gets rank ``base_rank + LOCAL_RANK``, as torch assigns them. The
    generation is the new round's, so the group the workers form shares no key with the
    old world's (see :mod:`elastic_train.context`)."""

    generation: str
    group_rank: int
    group_world_size: int
    base_rank: int
    world_size: int
    base_role_rank: int
    role_world_size: int
    master_addr: str

    def environ(self, local_rank: int) -> dict[str, str]:
        """The environment of worker ``local_rank`` in this world."""
        return {"RANK": str(self.base_rank + local_rank), "WORLD_SIZE": str(self.world_size),
                "ROLE_RANK": str(self.base_role_rank + local_rank),
                "ROLE_WORLD_SIZE": str(self.role_world_size),
                "GROUP_RANK": str(self.group_rank),
                "GROUP_WORLD_SIZE": str(self.group_world_size),
                "MASTER_ADDR": self.master_addr, env_vars.GENERATION: self.generation}


@dataclass(frozen=True)
class Go:
    """The agent's ``go.json``: attempt ``attempt`` may start; its workers see
    ``TORCHELASTIC_RESTART_COUNT=restart_count`` and, when the workers host their own
    store (``launch``: rank 0's ``env://`` store), ``MASTER_PORT=master_port``: a new port
    per attempt, so that a store the last attempt left behind is never joined again.

    With ``world``, the job's membership changed: the waiting workers take their place in
    the new world (its attempts count from 0 again, on every node alike) instead of
    waiting for the attempt they expected."""

    attempt: int
    restart_count: int
    master_port: int | None = None
    world: NewWorld | None = None

    def lets(self, attempt: int, generation: str | None) -> bool:
        """Whether a worker of ``generation`` waiting for ``attempt`` may start now."""
        return self.attempt >= attempt or (
            self.world is not None and self.world.generation != generation)

    def environ(self, local_rank: int) -> dict[str, str]:
        """What worker ``local_rank`` changes in its environment to start this attempt."""
        env = {"TORCHELASTIC_RESTART_COUNT": str(self.restart_count),
               env_vars.ATTEMPT: str(self.attempt)}
        if self.master_port is not None:
            env["MASTER_PORT"] = str(self.master_port)
        return env if self.world is None else {**env, **self.world.environ(local_rank)}

    @classmethod
    def from_json(cls, data: dict) -> Go:
        world = data.get("world")
        return cls(**{**data, "world": NewWorld(**world) if world else None})


@dataclass(frozen=True)
class Verdict:
    """The agent's ``verdict.json``: what follows failed attempt ``attempt``.

    ``restart``: another attempt follows (else the run stops). ``finish_s``: before
    that attempt, how long a worker may take to finish the checkpoint uploads it
    reported before the failure (0: drop them; a process of the attempt died or a
    node is gone, so a checkpoint with its share could never be committed).
    """

    attempt: int
    restart: bool
    finish_s: float = 0.0


def _record_path(directory: str, rank: int) -> str:
    return os.path.join(directory, f"rank{rank}.json")


def _write(path: str, data: dict) -> None:
    fsutil.write_local_atomic(path, json.dumps(data).encode())


def _read(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_record(directory: str, rank: int, record: WorkerRecord) -> None:
    _write(_record_path(directory, rank), record.to_json())


def read_record(directory: str, rank: int) -> WorkerRecord | None:
    data = _read(_record_path(directory, rank))
    return WorkerRecord.from_json(data) if data else None


def write_go(directory: str, go: Go) -> None:
    _write(os.path.join(directory, GO_FILE), asdict(go))


def read_go(directory: str) -> Go | None:
    data = _read(os.path.join(directory, GO_FILE))
    return Go.from_json(data) if data else None


def write_verdict(directory: str, verdict: Verdict) -> None:
    _write(os.path.join(directory, VERDICT_FILE), asdict(verdict))


def wait_for_verdict(directory: str, attempt: int, poll_s: float = 0.005) -> Verdict:
    """Blocks until the agent decided what follows failed ``attempt`` (a verdict for a
    later attempt means this one restarted). Like :func:`wait_for_go`, no timeout: a
    worker the agent does not answer is stopped by it."""
    while True:
        data = _read(os.path.join(directory, VERDICT_FILE))
        if data is not None and data["attempt"] > attempt:
            return Verdict(attempt, restart=True)
        if data is not None and data["attempt"] == attempt:
            return Verdict(**data)
        time.sleep(poll_s)


def wait_for_go(directory: str, attempt: int, generation: str | None = None,
                poll_s: float = 0.005) -> Go:
    """Blocks until the agent lets ``attempt`` (or a later one) start, or names a new
    world (see :meth:`Go.lets`). A worker that is not let go is stopped by its agent, so
    this needs no timeout of its own."""
    while (go := read_go(directory)) is None or not go.lets(attempt, generation):
        time.sleep(poll_s)
    return go


def clear(directory: str) -> None:
    """Before a new group of processes starts: forget every record of the previous one."""
    os.makedirs(directory, exist_ok=True)
    for name in os.listdir(directory):
        os.remove(os.path.join(directory, name))
