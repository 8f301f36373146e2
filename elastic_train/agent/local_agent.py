"""``TrainAgent``: torch's ``LocalElasticAgent`` with two additions.

1. Each incarnation of the worker group gets a *generation id*, agreed among
   the agents through the rendezvous round's store and given to the workers
   as ``ELASTIC_TRAIN_GENERATION``. Workers namespace their process-group keys
   with it, so a restarted group never reads the addresses of the previous one
   from the agent's long-lived store (the cause of torchrun's intermittent
   ``Gloo connectFullMesh failed`` after a restart).
2. Every failed attempt is reported to a callback before the agent restarts
   the group, so the driver can record it in the run's history; every
   rendezvous is reported too (this node's group rank and the node count).
3. Only this node's own failures spend its restart budget. When every failed
   worker here failed because of a peer (a node that left, a worker elsewhere
   that crashed), the restart is free: the node whose worker crashed charges
   its own budget, and a lost node is a membership change (counted in
   ``membership_changes``), not a failure of the job.

Everything else -- rendezvous, spawning, monitoring, restart budget,
membership changes, shutdown -- is torch.distributed.elastic's own.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

from elastic_train.agent.failures import failures_of, is_secondary
from elastic_train.agent.hang_watch import HangWatch
from elastic_train.context import AGENT_PID_ENV, GENERATION_ENV
from elastic_train.heartbeat import PROGRESS_DIR_ENV

FailureCallback = Callable[[RunResult, int], None]
RendezvousCallback = Callable[[int, int], None]


@contextlib.contextmanager
def _environ(values: Mapping[str, str]) -> Iterator[None]:
    """Sets environment variables for the block (the children inherit os.environ)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


class TrainAgent(LocalElasticAgent):
    """A ``LocalElasticAgent`` that namespaces worker generations and reports failures."""

    def __init__(self, *args: Any, worker_env: Mapping[str, str] | None = None,
                 on_failure: FailureCallback | None = None,
                 on_rendezvous: RendezvousCallback | None = None,
                 hang_watch: HangWatch | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._hang_watch = hang_watch
        self._worker_env = dict(worker_env or {})
        self._on_failure = on_failure
        self._on_rendezvous = on_rendezvous
        self.membership_changes = 0

    def _rendezvous(self, worker_group: WorkerGroup) -> None:
        previous = worker_group.group_world_size
        super()._rendezvous(worker_group)
        if previous is not None and worker_group.group_world_size != previous:
            self.membership_changes += 1
        if self._on_rendezvous is not None:
            self._on_rendezvous(worker_group.group_rank, worker_group.group_world_size)

    def _agree_on_generation(self, worker_group: WorkerGroup) -> str:
        restart_count = worker_group.spec.max_restarts - self._remaining_restarts
        key = f"elastic_train/generation/{restart_count}"
        store = worker_group.store
        if worker_group.group_rank == 0:
            store.set(key, uuid.uuid4().hex)
        return store.get(key).decode()

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        generation = self._agree_on_generation(worker_group)
        env = {**self._worker_env, GENERATION_ENV: generation, AGENT_PID_ENV: str(os.getpid())}
        if self._hang_watch is not None:
            self._hang_watch.reset([w.global_rank for w in worker_group.workers])
            env[PROGRESS_DIR_ENV] = self._hang_watch.progress_dir
        with _environ(env):
            return super()._start_workers(worker_group)

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        result = super()._monitor_workers(worker_group)
        if self._hang_watch is not None and result.state == WorkerState.HEALTHY \
                and self._pcontext is not None:
            pids = self._pcontext.pids()
            self._hang_watch.check({
                w.global_rank: (pids[w.local_rank], self._pcontext.error_files[w.local_rank])
                for w in worker_group.workers if w.local_rank in pids})
            # The killed workers show up as failures at the next check.
        if result.is_failed():
            if all(is_secondary(f) for f in failures_of(result)):
                self._remaining_restarts += 1  # a peer's failure: free restart
            if self._on_failure is not None:
                self._on_failure(result, self._remaining_restarts)
        return result
