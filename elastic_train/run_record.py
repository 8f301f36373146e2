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
from typing import Any

import torch

from elastic_train.errors import ConfigError, StorageError, WorkerFailure
from elastic_train.storage import RunStorage

logger = logging.getLogger(__name__)


def versions() -> dict[str, str]:
    from elastic_train import __version__

    return {"elastic_train": __version__, "torch": torch.__version__,
            "python": platform.python_version()}


class RunRecord:
    """``run.json`` of one run, as this driver process sees and updates it.

    Example::

        record = RunRecord.begin(storage, name="digits", spec={"command": [...]},
                                 identity=("command", [...]))
        ...
        record.set_status("finished")
    """

    def __init__(self, storage: RunStorage, state: dict[str, Any]):
        self.storage = storage
        self.state = state

    @classmethod
    def begin(cls, storage: RunStorage, name: str, spec: dict[str, Any],
              identity: tuple[str, Any] | None = None) -> RunRecord:
        """Starts a launch of the run; refuses a finished run or one of another program.

        ``identity`` is a ``(spec key, value)`` that must match a stored run's
        (the train function, or the launched command) for it to be resumed.
        """
        state = cls.check_resumable(storage, identity)
        now = time.time()
        state = state or {"name": name, "created": now, "launches": [], "failures": []}
        state.update(status="running", updated=now, versions=versions(), spec=spec)
        state["launches"].append({"started": now, "pid": os.getpid(),
                                  "host": platform.node(), "status": "running"})
        record = cls(storage, state)
        record._write(required=True)
        return record

    @staticmethod
    def check_resumable(storage: RunStorage, identity: tuple[str, Any] | None
                        ) -> dict[str, Any] | None:
        """The stored state, if the run may be (re)started here; else a ConfigError."""
        state = storage.read_run_state()
        if state and state.get("status") == "finished":
            raise ConfigError(
                f"The run {storage.display_path} has already finished. Use another run "
                "name to train again, or delete that directory."
            )
        if state and identity:
            key, value = identity
            stored = state.get("spec", {}).get(key)
            if stored is not None and stored != value:
                raise ConfigError(
                    f"The run {storage.display_path} was started with {key} {stored!r}, not "
                    f"{value!r}; its checkpoints may not fit. Use another run name for a new "
                    "run, or resume it as it was (TorchTrainer.restore(path) or "
                    "elastic-train restore PATH)."
                )
        return state

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
