"""Where the supported torch releases' DCP staging differs, decided by asking torch.

torch 2.11's ``DefaultStager`` closes its ``StateDictStager`` at the end of every
``stage()``: the staging buffers are dropped and a second ``stage()`` raises a
KeyError (its deepcopy table was emptied). 2.9 and 2.14 keep the buffers for the next
save, which then only copies. :func:`stager_is_reusable` finds out with a one-element
state; where it is not, ``async_save`` makes a stager per save, and so allocates
(and, with CUDA, pins) new buffers each time -- slower, and the figures say which
release measured them.
"""

from __future__ import annotations

import functools

import torch
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions


@functools.cache
def stager_is_reusable() -> bool:
    """Whether one ``DefaultStager`` stages more than once in this torch."""
    stager = DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=False,
                                          use_async_staging=False,
                                          use_non_blocking_copy=False))
    try:
        stager.stage({"probe": torch.zeros(1)})
        stager.stage({"probe": torch.zeros(1)})
    except KeyError:
        return False
    finally:
        stager.close()
    return True
