"""The deterministic job of :mod:`tests.support.jobs` on a GPU, with what each attempt's
process sees of its device.

:func:`train_mlp_on_gpu` appends one JSON line per attempt to ``config['probe_file']``
before training: the rank, the attempt (``TORCHELASTIC_RESTART_COUNT``), the pid,
whether torch marked the process a bad fork, whether a small CUDA computation works
on the worker's device, ``torch.cuda.memory_allocated()`` at that moment (what the
process still holds of a failed attempt) and whether the previous attempt's ballast in
this process is still alive. It then holds ``config['ballast_mb']`` MiB on the device
for the whole attempt -- a survivor of an in-process restart must have freed it before
its next attempt starts -- and trains :func:`tests.support.jobs.train_mlp`.

Works on CPU too (``use_gpu=False``): the memory is then None, the ballast check holds.
"""

from __future__ import annotations

import json
import os
import sys
import types
import weakref

import torch

import elastic_train as et
from elastic_train.torch import get_device
from tests.support import jobs

MIB = 2**20


def _process_state() -> dict:
    """A namespace that lives as long as this process: this module is pickled by value, so
    its own globals may be new in each attempt."""
    name = "_tests_gpu_jobs_state"
    return sys.modules.setdefault(name, types.ModuleType(name)).__dict__


def probe() -> dict:
    """What this attempt's process sees of its device, before it allocates anything."""
    device = get_device()
    cuda = device.type == "cuda"
    allocated = torch.cuda.memory_allocated(device) / MIB if cuda else None
    try:
        works = torch.full((4,), 2.0, device=device).sum().item() == 8.0
        error = ""
    except RuntimeError as exc:  # e.g. "Cannot re-initialize CUDA in forked subprocess"
        works, error = False, str(exc)[:300]
    previous = _process_state().get("ballast")
    return {"rank": et.get_context().get_world_rank(),
            "attempt": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
            "pid": os.getpid(), "device": str(device),
            "name": torch.cuda.get_device_name(device) if cuda and works else "",
            "bad_fork": bool(torch.cuda._is_in_bad_fork()), "works": works, "error": error,
            "allocated_mb": allocated,
            "previous_ballast_alive": previous is not None and previous() is not None}


def train_mlp_on_gpu(config: dict) -> dict:
    record = probe()
    with open(config["probe_file"], "a") as f:
        f.write(json.dumps(record) + "\n")
    ballast = torch.empty(config.get("ballast_mb", 0) * MIB, dtype=torch.uint8,
                          device=get_device())
    _process_state()["ballast"] = weakref.ref(ballast)
    result = jobs.train_mlp(config)
    del ballast  # held until here: a failed attempt leaves it in its frame
    return result


def read_probes(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
