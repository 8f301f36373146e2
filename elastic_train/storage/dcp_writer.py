"""Sharded checkpoints written by DCP's own writer process, tied to the worker.

``dcp.async_save(..., async_checkpointer_type=AsyncCheckpointerType.PROCESS)`` hands
the staged state to a writer process that torch starts at the first save and keeps
(one per process); the writers of all ranks form a gloo group of their own, so that
``dcp.save``'s planning collectives and the file writes run there, never in the
training process. What this module adds around it:

- **The writer dies with its worker.** torch starts it from an executor thread, so
  ``PR_SET_PDEATHSIG`` cannot be used; our storage writer, unpickled in the writer
  process with every request, starts :func:`~.parent_watch.die_with` there (see
  :mod:`.background_priority`, which also lowers the writer's priority). Before
  its first request an idle writer ends when its pipe closes. One gap remains: a
  worker that dies in the instant between the first save's start and its writer's
  start leaves the other ranks' writers waiting to form their group, without a watch,
  until gloo's timeout (torch starts them with its own code; nothing of ours runs
  there before the first request).
- **Cached plans.** ``DefaultSavePlanner(enable_plan_caching=True)``: from the second
  save of the same state layout on, the writers skip most of the planning exchange
  (the cache lives in the writer process, which lives as long as the attempt).
- **One writer per attempt.** torch keeps its writer for the life of the process;
  after an in-process restart its gloo group names the writers of the previous
  attempt, some of them dead. :func:`stop_writer_process` ends it; the next save
  starts a new one, with the ranks of the new attempt.
- **No fsync.** The upload copies the files into the run's storage, whose copy is
  made durable before the commit; an fsync here would be the same work twice
  (``FileSystemWriter(sync_files=False)``).
"""

from __future__ import annotations

import os
from concurrent.futures import Future
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import _async_process_executor as torch_writer
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

from elastic_train.storage import background_priority


class WorkerOwnedWriter(dcp.FileSystemWriter):
    """torch's ``FileSystemWriter`` (without fsync) that, once unpickled in the writer
    process, makes that process die with ``owner_pid``, the worker."""

    def __init__(self, path: str, owner_pid: int):
        super().__init__(path, sync_files=False)
        self.owner_pid = owner_pid

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if os.getpid() != self.owner_pid:  # in the writer process
            background_priority.settle_writer(self.owner_pid)


def save_in_writer_process(state: dict[str, Any], directory: str, group: Any,
                           stager: AsyncStager) -> Future:
    """Stages ``state`` with ``stager`` (the only part the caller waits for), then has
    torch's writer process save it into ``directory`` with the ranks of ``group``
    (which must have a CPU backend; it is used to start the writers only). Collective
    over ``group``. The future completes when this rank's files are written."""
    return dcp.async_save(state, storage_writer=WorkerOwnedWriter(directory, os.getpid()),
                          planner=DefaultSavePlanner(enable_plan_caching=True),
                          process_group=group, async_stager=stager,
                          async_checkpointer_type=AsyncCheckpointerType.PROCESS)


def writer_pid() -> int | None:
    """The pid of torch's writer process in this process, if one runs."""
    process = torch_writer._CHECKPOINT_PROCESS
    return process._save_process.pid if process is not None else None


def stop_writer_process() -> None:
    """Kills torch's writer process of this worker, if any (a save in flight fails), so
    that the next save starts one for the current ranks."""
    process = torch_writer._CHECKPOINT_PROCESS
    if process is None:
        return
    torch_writer._CHECKPOINT_PROCESS = None
    process._save_process.kill()
    process._save_process.join()
