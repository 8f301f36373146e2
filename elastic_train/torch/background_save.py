"""``elastic_train.torch.async_save``: a checkpoint training waits for only while the
state is copied into host memory.

The call copies the state into host memory -- shared memory, pinned as well when
this worker uses CUDA -- and returns. A separate
process (not a thread: it holds no GIL the training needs) then writes the files,
and ``report()`` uploads and commits them once they are written (see
:meth:`elastic_train.Checkpoint.from_directory`'s ``written``). The first save stages
with torch's ``DefaultStager``; the next ones of the same layout only copy into what
it staged (:mod:`.keeping_stager`).

The writer runs under ``SCHED_IDLE`` (see
:mod:`elastic_train.storage.background_priority`): it takes only the CPU time
training leaves, so on a node without idle cores the write takes longer, not the
steps. The first save of an attempt starts the writer (a new interpreter that imports
torch: seconds), so its checkpoint is committed that much later than the next ones;
training does not wait for it. The writer process dies with the worker; a checkpoint
whose files a killed writer left half written is never committed, so a restart
resumes from the one before. Like any process torch starts with ``spawn``, the writer
imports the worker's ``__main__``: a script under ``elastic-train launch`` must keep
its training under ``if __name__ == "__main__":``. Shared memory is ``/dev/shm``: a
container needs room there for the state (Docker's default is 64 MB).

It lives here, beside ``prepare_model``, rather than on ``Checkpoint``: it is about
torch tensors and ``torch.distributed.checkpoint``, where ``Checkpoint`` is any
directory of files (Ray's ``ray.train.Checkpoint`` knows no framework either).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from elastic_train._internal import scratch
from elastic_train.checkpoint import Checkpoint
from elastic_train.errors import ConfigError
from elastic_train.storage.dcp_writer import save_in_writer_process, stop_writer_process
from elastic_train.storage.file_writer import FileWriterProcess
from elastic_train.torch.keeping_stager import KeepingStager

logger = logging.getLogger(__name__)

# Under the prefix of the node's scratch directories: a driver starting on this node
# removes those of workers that ended (scratch.sweep), and so does the next saver.
DIRECTORY_PREFIX = scratch.NODE_PREFIX + "async_save_"


def async_save(state_dict: dict[str, Any], filename: str | None = None, *,
               process_group: Any = None) -> Checkpoint:
    """Saves ``state_dict`` in the background; returns the checkpoint to ``report()``.

    Blocks only while the state is copied into host memory; a writer process then
    writes the files, and ``report()`` commits them once written, without waiting.

    - ``filename`` given: one file, ``torch.save(state_dict, filename)`` as a
      ``torch.save`` user would write it; any rank may call it alone (usually rank 0).
      Load it with ``torch.load(os.path.join(directory, filename))``.
    - ``filename`` None: a sharded ``torch.distributed.checkpoint`` (DCP) checkpoint,
      written by DCP's own writer process with cached save plans -- FSDP2 / DTensor
      state, each rank its shards. Every rank of ``process_group`` must call it
      (default: all ranks, over a gloo group made once per attempt, as DCP's writers
      need a CPU backend). Load it with ``dcp.load(state, storage_reader=
      CheckpointReader(checkpoint))``.

    **At most one write is in flight per rank.** A save made while the previous one
    is still being written first waits for that write to end: the staging buffers
    the writer reads from are the ones the new copy goes into, and a rank that saves
    faster than its disk writes would otherwise fill host memory. That wait is the
    price of saving more often than a write takes (figure 11b measures it).

    The writer process -- its priority, its start at the first save of an attempt,
    its death with the worker, and what it asks of a script (a ``__main__`` guard)
    and of a container (room in ``/dev/shm``) -- is described in the module's docstring
    and in ``docs/large-models.md``.

    Example::

        from elastic_train.torch import async_save

        for epoch in range(epochs):
            train_one_epoch(model, optimizer)
            # a state_dict, one file:
            checkpoint = async_save({"model": model.state_dict(),
                                     "optimizer": optimizer.state_dict()}, "model.pt")
            # or FSDP2 shards (every rank):
            checkpoint = async_save({"model": model_state, "optim": optim_state})
            elastic_train.report({"loss": loss}, checkpoint=checkpoint)

    Args:
        state_dict: The state to save (nested dicts, lists and tensors, on any device).
        filename: The file's name for a single-file checkpoint; None for DCP shards.
        process_group: The ranks that save a sharded checkpoint together.
    """
    if filename is not None and (not filename or os.path.basename(filename) != filename):
        raise ConfigError(f"async_save(filename={filename!r}): give a file name without a "
                          "directory, e.g. async_save(state, 'model.pt').")
    return _saver_of_this_attempt().save(state_dict, filename, process_group)


@dataclass
class _Saver:
    """What a worker keeps from one save to the next, for one attempt (process group)."""

    world: Any  # the default process group of the attempt, None without one
    root: str  # the directory of this process's checkpoint directories being written
    stager: KeepingStager
    files: FileWriterProcess = field(default_factory=FileWriterProcess)
    previous: Future | None = None  # the last write, maybe still in flight
    gloo: Any = None  # the CPU group of sharded saves, made at the first one

    @classmethod
    def start(cls, world: Any) -> _Saver:
        scratch.sweep((DIRECTORY_PREFIX,))
        return cls(world, scratch.make(DIRECTORY_PREFIX), _new_stager())

    def save(self, state_dict: dict[str, Any], filename: str | None,
             process_group: Any) -> Checkpoint:
        """One :func:`async_save`: once the previous write ended, the state copied into
        the staging buffers and handed to a writer process, into a new directory."""
        self.wait_for_previous()
        directory = tempfile.mkdtemp(dir=self.root)
        if filename is None:
            group = process_group if process_group is not None else self.cpu_group()
            written = save_in_writer_process(state_dict, directory, group, self.stager)
        else:
            written = self.files.write(self.stager.stage(state_dict),
                                       os.path.join(directory, filename))
        self.previous = written
        return Checkpoint.from_directory(directory, written=written)

    def wait_for_previous(self) -> None:
        """The back-pressure rule: the previous write ends before the next copy."""
        if self.previous is None or self.previous.done():
            return
        began = time.perf_counter()
        wait([self.previous])
        logger.info("async_save waited %.3f s for the previous checkpoint's write",
                    time.perf_counter() - began)

    def cpu_group(self) -> Any:
        """The group DCP's writers start with: the default one when it is gloo, else
        a gloo group beside it (made by every rank at its first sharded save)."""
        if self.world is None:
            raise ConfigError("async_save(state) without a filename saves a sharded DCP "
                              "checkpoint, which needs torch.distributed: call it in a "
                              "train function, or pass filename='model.pt'.")
        if self.gloo is None:
            has_cpu = "gloo" in dist.get_backend(self.world)
            self.gloo = self.world if has_cpu else dist.new_group(backend="gloo")
        return self.gloo

    def close(self) -> None:
        """Ends the writers (writes in flight fail) and frees the staging buffers."""
        self.files.close()
        stop_writer_process()
        self.stager.close()
        shutil.rmtree(self.root, ignore_errors=True)


_saver: _Saver | None = None


def _new_stager() -> KeepingStager:
    """Into shared memory, which the writer maps instead of receiving a copy; pinned as
    well when this worker uses CUDA (its tensors are on a GPU), for a fast copy."""
    return KeepingStager(shared_memory=True, pin_memory=torch.cuda.is_initialized())


def _saver_of_this_attempt() -> _Saver:
    """This process's saver; a new one after an in-process restart (a new default
    process group), whose writers then start again with the new attempt's ranks."""
    global _saver
    world = dist.group.WORLD if dist.is_available() and dist.is_initialized() else None
    if _saver is not None and _saver.world is not world:
        _saver.close()
        _saver = None
    if _saver is None:
        _saver = _Saver.start(world)
    return _saver
