"""What a worker does after each ``report()``, besides the report itself.

A session runs its hooks, in order, once a report is done (its row recorded, its
checkpoint handed over), on every rank. None of them changes what the run keeps:
that is rank 0's committer (:mod:`.committer`). :data:`AFTER_REPORT` is the list
every session runs:

- :func:`beat`: marks progress for the agent's hang watch (:mod:`.heartbeat`);
- :func:`note_imports`: local rank 0 tells its agent which modules the zygote can
  preload (:mod:`.module_report`), once per process;
- :func:`injected_fault`: the crash ``elastic-train verify-resume`` asks for
  (:mod:`.fault_injection`); last, as it ends the process.
"""

from __future__ import annotations

from typing import Protocol

from elastic_train.context import WorkerEnv
from elastic_train.worker import heartbeat, module_report
from elastic_train.worker.fault_injection import maybe_fail_after_report


class AfterReport(Protocol):
    """A hook: ``iteration`` is the report's ``training_iteration``, ``env`` the rank's."""

    def __call__(self, iteration: int, env: WorkerEnv) -> None: ...


def beat(iteration: int, env: WorkerEnv) -> None:
    heartbeat.beat()


def note_imports(iteration: int, env: WorkerEnv) -> None:
    module_report.note_imports(env.rank, env.local_rank)


def injected_fault(iteration: int, env: WorkerEnv) -> None:
    maybe_fail_after_report(iteration, env.rank, env.world_size, env.restart_count)


AFTER_REPORT: tuple[AfterReport, ...] = (beat, note_imports, injected_fault)
