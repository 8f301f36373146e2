"""The agent's part of in-process restarts (departure 8 of :mod:`.local_agent`).

:class:`InProcessRestart` is mixed into :class:`~.local_agent.TrainAgent`: it
watches the workers before torch's monitoring does (which would stop them all
at the first death), and carries out an in-process restart with the agent's
own budget decision, hang watch and preemption notices; the steps themselves
are :class:`~.inprocess.InProcessRestarts`'. It uses the agent's attributes
(``_in_process``, ``_pcontext``, ``_worker_command``,
``_start_env``, ``_hang_watch``, ``_notice_dir``, ``_on_recovered``) and
methods (``_decide``, ``_check_hangs``, ``_preempted``).
"""

from __future__ import annotations

import logging
from typing import Any

from torch.distributed.elastic.agent.server.api import RunResult, Worker, WorkerGroup, WorkerState
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
from torch.distributed.elastic.utils import macros

from elastic_train.agent.failures import failures_of
from elastic_train.agent.inprocess.restarts import FailedAttempt, Seen
from elastic_train.agent.worker_slots import replace_worker
from elastic_train.errors import WorkerFailure
from elastic_train.failure_kinds import FailureKind
from elastic_train.storage.uploader import discard_staged
from elastic_train.worker import preemption

logger = logging.getLogger(__name__)


class InProcessRestart:
    """In-process restarts, as the agent's monitoring carries them out."""

    _in_process: Any
    _pcontext: Any

    def _watch_in_process(self, worker_group: WorkerGroup) -> RunResult | None:
        """The group's state when in-process restarts decide it; None when torch's own
        monitoring must (no in-process restarts, the group finished, or a worker that
        cannot restart in process)."""
        if self._in_process is None or self._pcontext is None:
            return None
        look = self._in_process.poll(worker_group, self._pcontext)
        if look.seen is Seen.FAILED:
            return self._restart_in_process(worker_group, look.failed)
        if look.seen is Seen.RUNNING:  # able to restart in process: torch must not stop them
            self._check_hangs(worker_group)  # type: ignore[attr-defined]
            return RunResult(state=WorkerState.HEALTHY)
        return None

    def _restart_in_process(self, worker_group: WorkerGroup, failed: FailedAttempt) -> RunResult:
        """Charges the failed attempt and runs the next one in the same processes; falls
        back to a restart of the whole group (torch's) when that is not possible."""
        assert self._in_process is not None and self._pcontext is not None
        own = self._in_process.interrupt(worker_group, failed)
        failures = failed.failures or [failed.root]
        kind = FailureKind.PREEMPTION if self._preempted() else (
            FailureKind.FAILURE if own else FailureKind.PEER)
        self.peer_root = None if own else failed.remote_root
        decision = self._decide(worker_group, failures, kind)
        if not decision.restart:
            self._in_process.give_up(worker_group, self._pcontext)
            return RunResult(state=WorkerState.FAILED)
        recovery = self._in_process.recover(worker_group, self._pcontext, lambda: (
            worker_group.spec.rdzv_handler.num_nodes_waiting() > 0))
        if recovery is None:
            logger.warning("The group could not restart in process; its workers restart "
                           "as new processes.")
            return RunResult(state=WorkerState.FAILED)
        if self._hang_watch is not None:
            self._hang_watch.reset([w.global_rank for w in worker_group.workers])
        if self._notice_dir is not None:
            preemption.clear(self._notice_dir)
        if self._on_recovered is not None:
            self._on_recovered(recovery)
        return RunResult(state=WorkerState.HEALTHY)

    def _replace_worker(self, worker: Worker, env: dict[str, str]) -> int:
        """A new process in ``worker``'s slot (an in-process restart's dead or killed rank)."""
        assert self._pcontext is not None
        spec = self.get_worker_group().spec
        entrypoint, args = (self._worker_command() if self._worker_command is not None
                            else (spec.entrypoint, spec.args))
        args = tuple(macros.substitute(list(args), str(worker.local_rank)))
        if self._staging_dir is not None:  # what the dead rank staged is stale
            discard_staged(self._staging_dir, worker.global_rank)
        return replace_worker(self._pcontext, worker, entrypoint, args,
                              {**self._start_env, **env})

    def _failure_of(self, worker: Worker, exitcode: int) -> WorkerFailure:
        """A dead worker, described from its exit and its error file (as torch would)."""
        assert self._pcontext is not None
        failure = ProcessFailure(local_rank=worker.local_rank, pid=worker.id or 0,
                                 exitcode=exitcode,
                                 error_file=self._pcontext.error_files[worker.local_rank])
        return failures_of(RunResult(WorkerState.FAILED,
                                     failures={worker.global_rank: failure}))[0]
