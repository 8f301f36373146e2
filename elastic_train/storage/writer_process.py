"""What a checkpoint writer process does first, whichever writer it is.

Both writers -- ours for single files (:mod:`.file_writer`) and torch's DCP writer
process (:mod:`.dcp_writer`) -- run beside the training on the same node:

- **It dies with its worker** (:func:`.parent_watch.die_with`).
- **It yields the CPU to training**: niceness +10 and one intra-op thread. A write
  that competes with the training's threads at equal priority slows every step it
  overlaps (on a node without idle cores); at +10 it takes the CPU time the training
  leaves, and a write that takes longer only delays its checkpoint's commit (and the
  next save, by the back-pressure rule, if saves come faster than writes end).
"""

from __future__ import annotations

import os

import torch

from elastic_train.storage.parent_watch import die_with

NICENESS = 10
_settled_for: int | None = None


def settle(owner_pid: int) -> None:
    """Makes this process a writer for ``owner_pid``; idempotent."""
    global _settled_for
    die_with(owner_pid)
    if _settled_for == owner_pid:
        return
    _settled_for = owner_pid
    os.nice(NICENESS)
    torch.set_num_threads(1)  # serialising needs no intra-op threads; training does
