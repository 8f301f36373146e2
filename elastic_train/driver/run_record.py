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

from elastic_train.driver.resume_rules import SpecChange, refusal, spec_changes
from elastic_train.errors import ConfigError, StorageError, WorkerFailure
from elastic_train.storage import RunStorage
from elastic_train.storage.archive import archive_run

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

    state: dict[str, Any] | None
    refused: str | None
    warnings: list[SpecChange]


class RunRecord:
    """``run.json`` of one run, as this driver process sees and updates it.

    Example::

        record = RunRecord.begin(storage, name="digits", spec={"command": [...]})
        ...
        record.set_status("finished")
    """

    def __init__(self, storage: RunStorage, state: dict[str, Any]):
        self.storage = storage
        self.state = state

    @classmethod
    def begin(cls, storage: RunStorage, name: str, spec: dict[str, Any], *,
              start_over: bool = False,
              accepted: frozenset[str] = frozenset()) -> RunRecord:
        """Starts a launch of the run: continues the stored run, or starts a fresh one.

        A stored run that cannot be continued (see :func:`check_resumable`) is
        refused, or with ``start_over`` moved aside first (never deleted).
        """
        check = cls.check_resumable(storage, spec, start_over=start_over, accepted=accepted)
        for change in check.warnings:
            logger.warning("Resuming %s with another %s; it continues, but not "
                           "bit-identically to a run of fixed size (the checkpoint's epoch "
                           "restarts with the new split of the data).",
                           storage.display_path, change.describe())
        if check.refused:
            archived = archive_run(storage, check.state.get("status", "unknown"))
            logger.warning("Start over: the stored run (%s) was moved to %s; a fresh run "
                           "starts at %s.", check.state.get("status"), archived,
                           storage.display_path)
        now = time.time()
        state = None if check.refused else check.state
        state = state or {"name": name, "created": now, "launches": [], "failures": []}
        state.update(status="running", updated=now, versions=versions(), spec=spec)
        state["launches"].append({"started": now, "pid": os.getpid(),
                                  "host": platform.node(), "status": "running"})
        record = cls(storage, state)
        record._write(required=True)
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
        changes = spec_changes(state.get("spec", {}), spec, accepted)
        reason = refusal(storage.display_path, state, spec, changes)
        if reason and not start_over:
            raise ConfigError(reason)
        return ResumeCheck(state, reason, [c for c in changes if not c.breaks])

    def record_failure(self, failures: list[WorkerFailure], restarts_left: int,
                       unlimited: bool, kind: str = "failure") -> None:
        """Appends a failed attempt; ``kind`` is the budget it spent: "failure" (a
        crash here), "peer" (a worker on another node; free) or "preemption"."""
        left = "unlimited" if unlimited else restarts_left or "no"
        logger.warning("Worker group failed (%s): %s; %s restart(s) left.", kind,
                       failures[0].describe(), left)
        failed_at = min((f.timestamp for f in failures if f.timestamp), default=time.time())
        self.state["failures"].append({"time": time.time(), "failed_at": failed_at,
                                       "restarts_left": restarts_left, "kind": kind,
                                       "workers": [f.to_json() for f in failures]})
        self._write(required=False)

    def note_rendezvous(self) -> None:
        """The group re-formed: closes the latest failure's rendezvous time."""
        failures = self.state["failures"]
        if failures and "rendezvous_at" not in failures[-1]:
            failures[-1]["rendezvous_at"] = time.time()
            self._write(required=False)

    def set_status(self, status: str, **extra: Any) -> None:
        now = time.time()
        self.state.update(status=status, updated=now, **extra)
        self.state["launches"][-1].update(status=status, ended=now)
        self._write(required=status == "finished")

    def _write(self, required: bool) -> None:
        try:
            self.storage.write_run_state(self.state)
        except StorageError:
            if required:
                raise
            logger.warning("Could not update %s/run.json (status %r).",
                           self.storage.display_path, self.state["status"], exc_info=True)
