"""Checkpoint work in the background yields the CPU to training.

Three kinds of work run beside the training on the same node: our writer process
for single files (:mod:`.file_writer`), torch's DCP writer process
(:mod:`.dcp_writer`), and each worker's upload thread (:mod:`.uploader`: copies,
checksums). At the training's priority, any of them slows every step it overlaps on
a node without idle cores. Each yields instead: it takes the CPU time the training
leaves, and work that takes longer only delays its checkpoint's commit (and the next
save, by the back-pressure rules, if saves come faster than they are written and
uploaded).

- **Writer processes run under ``SCHED_IDLE``**, every thread of them
  (:func:`settle_writer`). A niced task still gets a share of the CPU weighted by its
  nice value, and a training that communicates leaves gaps (its threads sleep in
  every collective) that a niced writer fills and then holds; a ``SCHED_IDLE`` task is
  preempted at once by any normal task that wakes. In figure 11b's local-disk run,
  steps during a write ran at 0.65x with the writer at nice +10 and 0.73x under
  ``SCHED_IDLE`` (two runs each). Even so, on a node without idle cores a writer that
  runs at all slows the steps (``python -m bench.background_cost``).
- **The upload thread only lowers its nice value** (:func:`yield_cpu`): it runs in the
  worker process and holds its GIL between I/O calls. At ``SCHED_IDLE`` it could keep
  the GIL, unscheduled, while the training thread waits for it. On Linux the nice
  value belongs to a thread, so the training's thread keeps its own.
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


def idle_process() -> None:
    """Puts every thread of this process under ``SCHED_IDLE`` (threads started later
    inherit it from theirs); where the platform has no such policy, lowers the calling
    thread's priority instead (:func:`yield_cpu`)."""
    if not hasattr(os, "SCHED_IDLE"):
        yield_cpu()
        return
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setscheduler(int(tid), os.SCHED_IDLE, os.sched_param(0))
        except ProcessLookupError:  # a thread that just ended
            pass


def settle_writer(owner_pid: int) -> None:
    """Makes this process a checkpoint writer for ``owner_pid``: it dies with it, and
    it runs only on CPU time that training leaves idle, with one intra-op thread;
    idempotent."""
    global _settled_for
    die_with(owner_pid)
    if _settled_for == owner_pid:
        return
    _settled_for = owner_pid
    idle_process()
    torch.set_num_threads(1)  # serialising needs no intra-op threads; training does
