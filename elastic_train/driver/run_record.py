"""The driver's record of a run in ``run.json``: launches, failures, status.

Used by ``fit()`` and by ``elastic-train launch`` alike. Only the final
"finished" must be stored; recording a failure or an interruption is best
effort, so an unreachable store never hides the real error.
"""

from __future__ import annotations

import logging
import os
import platform
import time
from dataclasses import dataclass
from typing import Any

import torch

from elastic_train._internal.departures import Departure
from elastic_train.agent.restart_budget import Decision
from elastic_train.driver.resume_rules import SpecChange, refusal, spec_changes
from elastic_train.errors import ConfigError, StorageError, WorkerFailure
from elastic_train.storage import RunStorage
from elastic_train.storage.archive import archive_run
from elastic_train.storage.run_state import (
    IN_PROCESS,
    NEW_PROCESSES,
    FailureKind,
    FailureRecord,
    LaunchRecord,
    RunState,
    RunStatus,
)
from elastic_train.stragglers import Straggler

logger = logging.getLogger(__name__)


def versions() -> dict[str, str]:
    from elastic_train import __version__

    return {"elastic_train": __version__, "torch": torch.__version__,
            "python": platform.python_version()}


@dataclass
class ResumeCheck:
    """The stored run as a new launch finds it.

    ``state``: the stored ``run.json`` (None: no run yet). ``refused``: why it
    cannot be continued (only returned with ``start_over``; the run is then
    archived). ``warnings``: changes it is continued despite.
    """

    state: RunState | None
    refused: str | None
    warnings: list[SpecChange]


class RunRecord:
    """``run.json`` of one run, as this driver process sees and updates it.

    Example::

        record = RunRecord.begin(storage, name="digits", spec={"command": [...]})
        ...
        record.set_status(RunStatus.FINISHED)
    """

    def __init__(self, storage: RunStorage, state: RunState):
        self.storage = storage
        self.state = state
        self.ledger = storage.ledger_file("driver")  # see elastic_train.goodput.breakdown
        self._joining = False  # a node joins: the group forms again (see note_join)

    @classmethod
    def begin(cls, storage: RunStorage, name: str, spec: dict[str, Any], *,
              start_over: bool = False, accepted: frozenset[str] = frozenset(),
              launched_at: float | None = None, takeover: bool = False,
              recorder: str | None = None) -> RunRecord:
        """Starts a launch of the run: continues the stored run, or starts a fresh one.
        ``launched_at``: when this launch's driver began (the goodput ledger's start-up
        counts from then; default now). ``takeover``: this node goes on recording a
        launch whose recording node was lost; the goodput ledger's launch line is that
        node's (a second one would start the launch again), while ``run.json`` gets a
        launch record of its own (the driver that records changed). ``recorder``: this
        driver's beacon, which the launch record names (``LaunchRecord.recorder``).

        A stored run that cannot be continued (see :func:`check_resumable`) is
        refused, or with ``start_over`` moved aside first (never deleted).
        """
        check = cls.check_resumable(storage, spec, start_over=start_over, accepted=accepted)
        for change in check.warnings:
            logger.warning("Resuming %s with another %s: %s.", storage.display_path,
                           change.describe(), change.note)
        if check.refused:
            archived = archive_run(storage, check.state.status.value)
            logger.warning("Start over: the stored run (%s) was moved to %s; a fresh run "
                           "starts at %s.", check.state.status.value, archived,
                           storage.display_path)
        now = time.time()
        state = None if check.refused else check.state
        state = state or RunState(name=name, created=now)
        state.status, state.updated, state.versions, state.spec = (
            RunStatus.RUNNING, now, versions(), spec)
        state.launches.append(LaunchRecord(started=now, pid=os.getpid(), host=platform.node(),
                                           recorder=recorder))
        record = cls(storage, state)
        record._write(required=True)
        if not takeover:
            record.ledger.append({"event": "launch", "t": launched_at or now})
        return record

    @staticmethod
    def check_resumable(storage: RunStorage, spec: dict[str, Any], *,
                        start_over: bool = False,
                        accepted: frozenset[str] = frozenset()) -> ResumeCheck:
        """What a launch with ``spec`` does with the stored run: continue it, or not.

        A finished run, or one whose spec changed in a way that breaks resume
        (:mod:`elastic_train.driver.resume_rules`), is refused with a ConfigError that
        says why and how to proceed -- unless ``start_over``, where it is
        reported as ``refused`` for the caller to archive. A run that can be
        continued is continued, with or without ``start_over``: a script that
        always passes it still resumes after a crash.
        """
        state = storage.read_run_state()
        if not state:
            return ResumeCheck(None, None, [])
        changes = spec_changes(state.spec, spec, accepted)
        reason = refusal(storage.display_path, state, spec, changes)
        if reason and not start_over:
            raise ConfigError(reason)
        return ResumeCheck(state, reason, [c for c in changes if not c.breaks])

    def record_failure(self, failures: list[WorkerFailure], decision: Decision,
                       cause: WorkerFailure | None = None,
                       known_at: float | None = None) -> None:
        """Appends a failed attempt, with the budget it spent and what is left of it.

        ``failures``: this node's failed workers, root cause first; ``cause``: when
        another node is at fault (a PEER decision), the root cause there, recorded first
        (``FailureRecord.root``). ``failed_at`` is when this node's first worker failed:
        read on this node's clock, as ``time`` is -- another node's may be far off.
        ``known_at``: when the agent knew (default now)."""
        left = {-1: "unlimited", 0: "no"}.get(decision.restarts_left, decision.restarts_left)
        own = [f for f in failures if f != cause]  # (in-process, a node that only heard of
        workers = [cause, *own] if cause is not None else own  # the failure has none)
        if decision.leave is not None:
            outlook = f"this node leaves the job: {decision.leave.reason}"
        elif decision.no_progress:
            outlook = f"stopping: {decision.no_progress}"
        elif decision.kind is FailureKind.PEER:  # its own budget is untouched: say so
            outlook = f"restarting, not charged to this node ({left} restart(s) of its own left)"
        elif decision.restart:  # counted after this restart, as run.json's restarts_left
            outlook = ("restarting (restarts unlimited)" if decision.restarts_left == -1 else
                       f"restarting; {left} restart(s) left after this one")
        else:
            outlook = "no restart left: the run stops"
        logger.warning("Worker group failed (%s): %s; %s.", decision.kind.value,
                       workers[0].describe(), outlook)
        known_at = time.time() if known_at is None else known_at
        failed_at = min((f.timestamp for f in own or workers if f.timestamp), default=known_at)
        failure = FailureRecord(time=known_at, failed_at=failed_at,
                                restarts_left=decision.restarts_left, kind=decision.kind,
                                workers=workers)
        self.state.failures.append(failure)
        self._joining = False  # the failure's rendezvous is the one to come
        self._write(required=False)
        self.ledger.append({"event": "fault", "t": failure.time, "failed_at": failed_at,
                            "kind": decision.kind.value})

    @property
    def failure_open(self) -> bool:
        """Whether the latest failure still waits for its group to form again."""
        failures = self.state.failures
        return bool(failures) and failures[-1].rendezvous_at is None

    def note_join(self, known_at: float | None = None) -> None:
        """A node waits to join the running job (the agent knew at ``known_at``, default
        now): the group forms again though nothing failed. The ledger's ``join`` line
        starts that rendezvous (no failure of the run)."""
        self._joining = True
        self.ledger.append({"event": "join", "t": time.time() if known_at is None else known_at})

    def note_rendezvous(self) -> None:
        """The group formed again: closes the latest failure's rendezvous time (and the
        restart's kind, new processes until :meth:`note_recovery` says otherwise), or a
        joining node's."""
        if self._joining:
            self._joining = False
            self.ledger.append({"event": "rendezvous", "t": time.time()})
            return
        if self.failure_open:
            failures = self.state.failures
            failures[-1].rendezvous_at = time.time()
            failures[-1].restart = NEW_PROCESSES
            self._write(required=False)
            self.ledger.append({"event": "rendezvous", "t": failures[-1].rendezvous_at})

    def note_recovery(self, replaced: dict[int, str]) -> None:
        """The group restarted in process: the latest failure's recovery time, and the
        ranks that got a new process. After a membership change the nodes rendezvoused
        first (:meth:`note_rendezvous` closed the time), and the workers kept their
        processes all the same."""
        failures = self.state.failures
        if failures and failures[-1].restart != IN_PROCESS:
            if failures[-1].rendezvous_at is None:
                failures[-1].rendezvous_at = time.time()
            failures[-1].restart, failures[-1].replaced = IN_PROCESS, dict(replaced)
            self._write(required=False)

    def note_zygote_errors(self, errors: list[dict[str, Any]]) -> None:
        """Appends worker zygotes that failed to start (see ``RunState.zygote_errors``)."""
        if errors:
            self.state.zygote_errors.extend(errors)
            self._write(required=False)

    def note_straggler(self, straggler: Straggler) -> None:
        """Appends a node named slow (see :mod:`elastic_train.stragglers`)."""
        self.state.stragglers.append(straggler)
        self._write(required=False)

    def note_departures(self, departures: list[Departure]) -> list[Departure]:
        """Adds the nodes that left the job (read from the run directory, see
        :mod:`elastic_train._internal.departures`) that ``run.json`` does not list yet;
        returns them."""
        known = set(self.state.departures)
        new = [d for d in departures if d not in known]
        if new:
            self.state.departures.extend(new)
            self._write(required=False)
        return new

    def set_status(self, status: RunStatus, error: str | None = None,
                   no_progress: str | None = None) -> None:
        now = time.time()
        self.state.status, self.state.updated = status, now
        if error is not None:
            self.state.error = error
        self.state.no_progress = no_progress
        self.state.launches[-1].status, self.state.launches[-1].ended = status, now
        self._write(required=status is RunStatus.FINISHED)
        self.ledger.append({"event": "end", "t": now, "status": status.value})

    def _write(self, required: bool) -> None:
        try:
            self.storage.write_run_state(self.state)
        except StorageError as exc:  # it names the operation, the file and the cause
            if required:
                raise
            logger.warning("Could not update %s/run.json (status %r): %s",
                           self.storage.display_path, self.state.status.value, exc)
