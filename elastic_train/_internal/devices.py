"""How many accelerators this node has, asked without touching their runtime here.

The driver (``fit()``, or ``launch``'s agent) is the process the worker zygote
is forked from. ``torch.cuda.is_available()`` or ``device_count()`` there
leaves ``torch.cuda.is_initialized()`` False but registers torch's fork
poison: every process forked afterwards -- the zygote, and each worker it
forks -- fails its first CUDA call with ``Cannot re-initialize CUDA in forked
subprocess`` (and an NVML handle, which ``PYTORCH_NVML_BASED_CUDA_CHECK=1``
opens instead, does not survive a fork either: NCCL fails in the child). So
the count is taken in a short-lived forked child that exits right after
(:mod:`elastic_train._internal.forked_call`), and kept for the process (per kind and
``CUDA_VISIBLE_DEVICES``).

A process that initialised CUDA already is counted in place: it is poisoned
anyway (its zygote starts as a new interpreter, see
:mod:`elastic_train.agent.zygote.fork`), and a child of it could not count.

Example::

    from elastic_train._internal import devices
    devices.count("cuda")         # 0 on a CPU node; never poisons this process
"""

from __future__ import annotations

import functools
import logging
import os

from elastic_train._internal.forked_call import call_in_child

logger = logging.getLogger(__name__)

KINDS = ("cuda", "xpu", "accelerator")  # torch.cuda, torch.xpu, torch.accelerator
PROBE_TIMEOUT_S = 60.0  # creating the driver context on a node of 8 GPUs takes seconds


def count(kind: str) -> int:
    """The devices of ``kind`` (one of :data:`KINDS`) visible to this process; 0 if none."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: use one of {KINDS}")
    return _count(kind, os.environ.get("CUDA_VISIBLE_DEVICES"))


@functools.cache
def _count(kind: str, _visible: str | None) -> int:
    import torch

    if torch.cuda.is_initialized() or not hasattr(os, "fork"):
        return _count_here(kind)
    counted = _count_in_child(kind)
    if counted is None:
        logger.warning("Counting %s devices in a child process failed; counting them here "
                       "(the worker zygote then starts as a new interpreter).", kind)
        return _count_here(kind)
    return counted


def _count_here(kind: str) -> int:
    import torch

    module = getattr(torch, kind, None)
    if module is None or not module.is_available():
        return 0
    return int(module.device_count())


def _count_in_child(kind: str) -> int | None:
    """:func:`_count_here` in a forked child; None if it did not answer in time."""
    answer = call_in_child(lambda: _count_here(kind), PROBE_TIMEOUT_S)
    return answer.value if answer.ok else None
