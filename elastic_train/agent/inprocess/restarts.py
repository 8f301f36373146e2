"""In-process restarts, the agent's side: end a failed attempt without ending the processes.

The worker's side is :mod:`elastic_train.worker.inprocess`; they talk through
the files of :mod:`elastic_train.worker.inprocess.channel`. The agents of a
multi-node job talk through the rendezvous round's store (:mod:`.attempt_store`).
One attempt ends in four steps:

1. **Detect** (:meth:`InProcessRestarts.poll`, every monitor interval): a
   local worker died, reported its own error, or reported an unhealthy device;
   or another node announced that the attempt failed.
2. **Announce and interrupt** (:meth:`~InProcessRestarts.interrupt`): the
   failure goes into the store (the first node to fail names the root cause;
   ``primary`` says some node failed by itself rather than through a peer),
   and every local worker still in the train function gets the abort signal.
   The agent then charges the restart budget as for any failure.
3. **Recover** (:meth:`~InProcessRestarts.recover`): the survivors unwind and
   report ``ready``; a dead one, one that is not ready within
   ``unwind_timeout_s`` (killed now) and an unhealthy one get a new worker
   forked from the zygote. With several nodes the agents then wait for each
   other; when a node gives up (its budget is spent), is waiting to join, or
   never arrives (it is gone), the job's membership changes: the agents
   rendezvous again (torch's round) and :meth:`~InProcessRestarts.reform`
   hands the waiting workers their ranks in the new world. When the budget is
   spent instead, the workers are told so and finish their checkpoint uploads
   in flight (:meth:`~InProcessRestarts.give_up`) before the group stops.
4. **Go**: ``go.json`` lets attempt N+1 start (or the new world's attempt 0);
   the workers form a new process group (keys namespaced by the generation and
   the attempt) and call the train function again.

Nothing here restarts a process that did not fail: on the other nodes of a
job, a failure costs their workers one unwind and a new process group; a lost
node costs the survivors a rendezvous as well.
"""

from __future__ import annotations

import enum
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch.distributed.elastic.agent.server.api import Worker, WorkerGroup

from elastic_train._internal import env_vars
from elastic_train.agent.failures import Cause, Observed
from elastic_train.agent.inprocess import attempt_store
from elastic_train.agent.node_liveness import nobody
from elastic_train.agent.worker_slots import kill
from elastic_train.errors import WorkerFailure
from elastic_train.worker.inprocess import channel
from elastic_train.worker.inprocess.channel import Go, NewWorld, Stage, Verdict, WorkerRecord

logger = logging.getLogger(__name__)

SECONDARY_GRACE_S = 0.5  # how long broken collectives alone wait for the failure behind them
RAISED_GRACE_S = 0.3  # how long a raised error waits for a local death that may explain it
PEER_PRIMARY_WAIT_S = 1.0  # how long a node that failed only through peers waits to hear why
AGENT_BARRIER_EXTRA_S = 5.0  # on top of the unwind timeout, for the other nodes to arrive


@dataclass(frozen=True)
class InProcessSettings:
    """``directory``: where the agent and its workers exchange their records (see
    :mod:`elastic_train.worker.inprocess.channel`); ``unwind_timeout_s``: how long a
    survivor may take to leave a failed attempt before it is killed and replaced."""

    directory: str
    unwind_timeout_s: float


@dataclass(frozen=True)
class FailedAttempt:
    """An attempt that failed, as this node saw it.

    ``failures``: this node's failed workers, root cause first (empty when only
    another node failed so far). ``primary``: one of them failed by itself (died,
    hung, or raised outside torch's communication code). ``died``: a local worker's
    process ended.
    """

    attempt: int
    failures: list[WorkerFailure]
    primary: bool
    remote_root: WorkerFailure | None = None
    died: bool = False

    @property
    def root(self) -> WorkerFailure | None:
        return self.failures[0] if self.failures else self.remote_root

    @property
    def all_alive(self) -> bool:
        """Whether every worker process of the attempt lives, as far as this node knows:
        none of its own ended, and the root cause another node announced is an error a
        worker raised (reported with exit code 1), not a death."""
        return not self.died and (self.remote_root is None or self.remote_root.exitcode == 1)


class Seen(enum.Enum):
    """What one look at the workers found (:meth:`InProcessRestarts.poll`)."""

    RUNNING = "running"  # the attempt runs, and every live worker can restart in process
    FAILED = "failed"  # the attempt failed: the look's ``failed`` says how
    TORCH = "torch"  # torch's monitoring decides: the group finished, or a live worker
    #                  cannot restart in process (a script without the wrapper)


@dataclass(frozen=True)
class Look:
    """One look at the workers: what it found, and the failed attempt when it failed."""

    seen: Seen
    failed: FailedAttempt | None = None


_RUNNING, _TORCH = Look(Seen.RUNNING), Look(Seen.TORCH)


@dataclass
class Recovery:
    """How an in-process restart went: the ranks that got a new process, and why."""

    attempt: int
    replaced: dict[int, str] = field(default_factory=dict)


class InProcessRestarts:
    """One node's in-process restarts of one group of worker processes.

    ``replace(worker, env)`` starts a new process in a worker's slot (see
    :mod:`.worker_slots`); ``failure_of(worker, exitcode)`` describes a dead
    worker from its error file, and how it ended (by itself, or waiting for a peer:
    :class:`~elastic_train.agent.failures.Cause`); ``gone()``: the group ranks known gone
    (:mod:`elastic_train.agent.node_liveness`), never waited for.
    """

    def __init__(self, directory: str, unwind_timeout_s: float,
                 replace: Callable[[Worker, dict[str, str]], int],
                 failure_of: Callable[[Worker, int], Observed],
                 gone: Callable[[], set[int]] = nobody):
        self._gone = gone
        self.directory = directory
        self.unwind_timeout_s = unwind_timeout_s
        self._replace = replace
        self._failure_of = failure_of
        self.attempt = 0
        self._base_restarts = 0
        self._capable: set[int] = set()
        self._secondary_since: float | None = None

    @property
    def finish_s(self) -> float:
        """How long live workers may take to finish the uploads they reported before
        they leave an attempt: half the unwind timeout (the other half is for
        unwinding)."""
        return self.unwind_timeout_s / 2

    def begin(self, restart_count: int) -> dict[str, str]:
        """A new group of processes starts (attempt 0); returns the workers' environment."""
        channel.clear(self.directory)
        self.attempt, self._base_restarts, self._capable = 0, restart_count, set()
        return {env_vars.INPROCESS_DIR: self.directory, env_vars.ATTEMPT: "0"}

    # 1. detect
    def poll(self, group: WorkerGroup, pcontext: Any) -> Look:
        """Where the attempt stands (:class:`Seen`), with the failed attempt if it failed."""
        exits = {w.local_rank: pcontext.subprocess_handlers[w.local_rank].proc.poll()
                 for w in group.workers}
        if all(code == 0 for code in exits.values()):
            return _TORCH
        records = {w.local_rank: channel.read_record(self.directory, w.global_rank)
                   for w in group.workers}
        self._capable |= {lr for lr, record in records.items() if record is not None}
        if any(lr not in self._capable for lr in exits):
            return _TORCH  # a worker that never said it can restart in process (torchrun's)
        found: list[tuple[WorkerFailure, bool]] = []
        killed: set[int] = set()  # ranks ended by a signal: the likeliest root cause
        died = False
        for worker in group.workers:
            code, record = exits[worker.local_rank], records[worker.local_rank]
            if code not in (None, 0):
                seen = self._failure_of(worker, code)  # it died: its own, unless it was
                found.append((seen.failure, seen.cause is not Cause.BROKEN))  # a peer's
                died = True
                if code < 0:
                    killed.add(worker.global_rank)
            elif code is None and record is not None and self._failed_now(record):
                found.append(_raised(worker, record))
        remote = attempt_store.announced(group, self.attempt)
        if not found and remote is None:
            return _RUNNING
        dying = any(exits[lr] is None and record is not None and not _running(record.pid)
                    for lr, record in records.items())
        if self._too_early(found, remote, died, dying or attempt_store.several(group)):
            return _RUNNING
        found.sort(key=lambda item: (not item[1], item[0].rank not in killed,
                                     item[0].traceback is None, item[0].timestamp,
                                     item[0].rank))
        return Look(Seen.FAILED, FailedAttempt(self.attempt, [f for f, _ in found],
                                               any(p for _, p in found), remote, died))

    def _too_early(self, found: list[tuple[WorkerFailure, bool]],
                   remote: WorkerFailure | None, died: bool, explainable: bool) -> bool:
        """Whether to wait a moment for a death before acting on raised errors: a peer's
        death may be what they are about, and it is the root cause to record (gloo reports
        a dead peer as a plain RuntimeError, out of backward() as much as out of a
        collective). Broken collectives alone wait longer than errors that look like the
        worker's own; those wait only while a death could still explain them
        (``explainable``): a local worker's process has ended but the agent has not seen
        it yet (the zygote reports it a few milliseconds later), or another node's may
        have. On one node whose workers all run, a raised error is acted on at once."""
        if remote is not None or died:
            self._secondary_since = None
            return False
        now = time.monotonic()
        if self._secondary_since is None:
            self._secondary_since = now
        if any(p for _, p in found):
            return explainable and now - self._secondary_since < RAISED_GRACE_S
        return now - self._secondary_since < SECONDARY_GRACE_S

    def _failed_now(self, record: WorkerRecord) -> bool:
        """A record that reports a failure of the current attempt. A worker ``ready`` (or
        ``unhealthy``) for attempt N+1 failed in attempt N; once N+1 runs, the failure it
        still carries is the last attempt's, not a new one."""
        after = record.stage in (Stage.READY, Stage.UNHEALTHY)
        if (record.attempt - 1 if after else record.attempt) != self.attempt:
            return False
        return record.stage is Stage.UNHEALTHY or record.failure is not None

    # 2. announce and interrupt
    def interrupt(self, group: WorkerGroup, failed: FailedAttempt) -> bool:
        """Tells the other nodes and stops every local worker still in the attempt.
        Returns whether the failure is this node's own (some node must pay for it: when
        no node says it failed by itself within a second, this one does). While a node
        is known gone, only a local worker killed by a signal is: the rest is what the
        loss caused, charged to nobody who survived it."""
        attempt_store.announce(group, self.attempt,
                               failed.failures[0] if failed.failures else None, failed.primary)
        for worker in group.workers:
            record = channel.read_record(self.directory, worker.global_rank)
            if record is not None and record.stage is Stage.RUNNING \
                    and record.attempt == self.attempt:
                _signal(record.pid, channel.ABORT_SIGNAL)
        if not attempt_store.several(group):
            return True
        if self._gone():
            return any(f.exitcode < 0 for f in failed.failures)
        if failed.primary:
            return True
        return not attempt_store.failed_by_itself_elsewhere(group, self.attempt,
                                                            PEER_PRIMARY_WAIT_S, self._gone)

    def leave(self, group: WorkerGroup, pcontext: Any) -> Recovery:
        """Every local worker leaves the running attempt although nothing failed (a node
        waits to join the job): they finish the uploads they reported (every process
        lives) and wait, ready, for :meth:`reform`. Returns the slots that did not leave
        in time (killed: :meth:`reform` gives them new processes)."""
        channel.write_verdict(self.directory, Verdict(self.attempt, True, self.finish_s))
        for worker in group.workers:
            record = channel.read_record(self.directory, worker.global_rank)
            if record is not None and record.stage is Stage.RUNNING \
                    and record.attempt == self.attempt:
                _signal(record.pid, channel.ABORT_SIGNAL)
        return Recovery(self.attempt + 1, self._unwind(group, pcontext, self.attempt + 1))

    def give_up(self, group: WorkerGroup, pcontext: Any) -> None:
        """This node stops (its budget is spent): the other nodes must not wait for it.
        Its workers learn it from the verdict; a worker with a checkpoint upload in
        flight finishes it (see :mod:`elastic_train.worker.inprocess.channel`), and this
        waits up to ``unwind_timeout_s`` for every worker to have left the attempt."""
        attempt_store.give_up(group, self.attempt)
        channel.write_verdict(self.directory, Verdict(self.attempt, restart=False))
        deadline = time.monotonic() + self.unwind_timeout_s
        while time.monotonic() < deadline and not all(
                self._left(worker, pcontext) for worker in group.workers):
            time.sleep(0.005)

    def _left(self, worker: Worker, pcontext: Any) -> bool:
        """Whether ``worker`` is out of the current attempt: dead, done with it (uploads
        finished), or waiting for the next one."""
        if pcontext.subprocess_handlers[worker.local_rank].proc.poll() is not None:
            return True
        record = channel.read_record(self.directory, worker.global_rank)
        return record is not None and (
            (record.stage is Stage.STOPPED and record.attempt == self.attempt)
            or (record.stage in (Stage.READY, Stage.UNHEALTHY)
                and record.attempt > self.attempt))

    # 3. recover, 4. go
    def recover(self, group: WorkerGroup, pcontext: Any, failed: FailedAttempt,
                membership_changed: Callable[[], bool]) -> Recovery | None:
        """Brings every local worker to the next attempt; None when the job's nodes must
        rendezvous again first (another node gave up, is gone or is joining): then every
        local worker waits, ready, for :meth:`reform`.

        When every worker of the attempt lives (``failed.all_alive``, no node known
        gone), the workers first finish the checkpoint uploads they reported before the
        failure, within :attr:`finish_s` (half the unwind timeout): the
        next attempt resumes from the last checkpoint reported, as after a synchronous
        upload. Otherwise they drop them: a checkpoint whose share a dead process held
        can never be committed, and the commit would wait for it."""
        finish_s = self.finish_s if failed.all_alive and not self._gone() else 0.0
        channel.write_verdict(self.directory, Verdict(self.attempt, True, finish_s))
        target = self.attempt + 1
        recovery = Recovery(target, self._unwind(group, pcontext, target))
        restart_count = self._base_restarts + target
        for worker in group.workers:
            if worker.global_rank in recovery.replaced:
                self._replace(worker, {env_vars.ATTEMPT: str(target),
                                       "TORCHELASTIC_RESTART_COUNT": str(restart_count)})
        own_store = not group.spec.rdzv_handler.use_agent_store  # launch: rank 0 hosts it
        port = _free_port() if own_store and group.group_rank == 0 else None
        if attempt_store.several(group):
            if port is not None:
                attempt_store.share_port(group, target, port)
            if not attempt_store.all_ready(group, self.attempt, self.unwind_timeout_s +
                                           AGENT_BARRIER_EXTRA_S, membership_changed,
                                           self._gone):
                return None
            if own_store:
                port = attempt_store.share_port(group, target, port)
        channel.write_go(self.directory, Go(target, restart_count, port))
        self.attempt, self._secondary_since = target, None
        return recovery

    def reform(self, group: WorkerGroup, pcontext: Any, world: NewWorld,
               restart_count: int) -> Recovery:
        """After :meth:`recover` found the job's membership changed and the agents met in a
        new rendezvous round (``group`` holds its ranks): the waiting workers start the new
        world's attempt 0 in their processes; a slot whose process ended gets a new one.
        Records of the old world are cleared first (every live worker waits for the go
        and writes nothing until then)."""
        channel.clear(self.directory)
        self.attempt, self._base_restarts, self._secondary_since = 0, restart_count, None
        go = Go(0, restart_count, group.master_port, world)
        replaced: dict[int, str] = {}
        for worker in group.workers:
            env = go.environ(worker.local_rank)
            pcontext.envs[worker.local_rank].update(env)  # what a replacement starts with
            if pcontext.subprocess_handlers[worker.local_rank].proc.poll() is not None:
                replaced[worker.global_rank] = "its process ended"
                self._replace(worker, env)
        channel.write_go(self.directory, go)
        return Recovery(0, replaced)

    def _unwind(self, group: WorkerGroup, pcontext: Any, target: int) -> dict[int, str]:
        """Waits for the local workers to be ready for ``target``; kills those that are not
        within the unwind timeout or are unhealthy. Returns rank -> why it needs a new
        process."""
        deadline = time.monotonic() + self.unwind_timeout_s
        pending = {w.local_rank: w for w in group.workers}
        replaced: dict[int, str] = {}
        while pending:
            for local_rank, worker in list(pending.items()):
                proc = pcontext.subprocess_handlers[local_rank].proc
                record = channel.read_record(self.directory, worker.global_rank)
                if proc.poll() is not None:
                    replaced[worker.global_rank] = "its process ended"
                elif record is not None and record.stage is Stage.UNHEALTHY:
                    kill([record.pid, proc.pid])
                    replaced[worker.global_rank] = "its device was unhealthy"
                elif not (record is not None and record.stage is Stage.READY
                          and record.attempt >= target):
                    continue
                del pending[local_rank]
            if pending and time.monotonic() > deadline:
                for worker in pending.values():
                    record = channel.read_record(self.directory, worker.global_rank)
                    handler = pcontext.subprocess_handlers[worker.local_rank]
                    kill(([record.pid] if record else []) + [handler.proc.pid])
                    replaced[worker.global_rank] = (
                        f"it did not leave the failed attempt within {self.unwind_timeout_s:g}s")
                    logger.warning("Rank %d %s; killed, a new process takes its place.",
                                   worker.global_rank, replaced[worker.global_rank])
                break
            time.sleep(0.005)
        return replaced

def _free_port() -> int:
    """A port nothing listens on now, for the next attempt's store on this node."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not ended (a zombie has: its parent, the
    zygote, has yet to reap it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rpartition(b")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _raised(worker: Worker, record: WorkerRecord) -> tuple[WorkerFailure, bool]:
    """A live worker's own report: its error (with the exit code the process would have
    ended with), or an unhealthy device."""
    note = record.failure
    message = note.message if note else "its device is unhealthy after the failure"
    return WorkerFailure(
        rank=worker.global_rank, local_rank=worker.local_rank, pid=record.pid,
        exitcode=note.exitcode if note else 1,
        message=message, traceback=note.traceback if note else None,
        hostname=socket.gethostname(), timestamp=note.timestamp if note else time.time(),
        config_error=note.config_error if note else False,
    ), (note.primary if note else True)
