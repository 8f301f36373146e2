"""Checkpoint work in the background yields the CPU to training.

Three kinds of work run beside the training on the same node: our writer process
for single files (:mod:`.file_writer`), torch's DCP writer process
(:mod:`.dcp_writer`), and each worker's upload thread (:mod:`.uploader`: copies,
checksums). At the training's priority, any of them slows every step it overlaps on
a node without idle cores. Each lowers its own priority by :data:`NICENESS` instead:
it takes the CPU time the training leaves, and work that takes longer only delays
its checkpoint's commit (and the next save, by the back-pressure rules, if saves
come faster than they are written and uploaded). On Linux the nice value belongs to
a thread, so the upload thread lowers itself alone, not the training's thread.
"""

from __future__ import annotations

import os
import threading

import torch

from elastic_train.storage.parent_watch import die_with

NICENESS = 10
_settled_for: int | None = None


def yield_cpu() -> None:
    """Lowers the calling thread's priority by :data:`NICENESS` (the process's other
    threads keep theirs)."""
    thread = threading.get_native_id()
    os.setpriority(os.PRIO_PROCESS, thread,
                   min(19, os.getpriority(os.PRIO_PROCESS, thread) + NICENESS))


def settle_writer(owner_pid: int) -> None:
    """Makes this process a checkpoint writer for ``owner_pid``: it dies with it, and
    its (calling) thread yields the CPU with one intra-op thread; idempotent."""
    global _settled_for
    die_with(owner_pid)
    if _settled_for == owner_pid:
        return
    _settled_for = owner_pid
    yield_cpu()
    torch.set_num_threads(1)  # serialising needs no intra-op threads; training does
