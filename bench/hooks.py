"""Torch-only hooks of the torchrun variants: (a) nothing, (b) ``torch.save`` per epoch.

No elastic_train import here: the floor must not pay for it.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from bench.events import EventLog
from bench.workload import load_state


class NoHooks:
    """(a): the floor -- no checkpoints, no reports."""

    def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
        return 0

    def after_step(self, epoch: int, step: int, loss: float) -> None:
        pass

    def after_epoch(self, epoch: int, loss: float, state: dict[str, Any]) -> None:
        pass


class TorchSaveHooks:
    """(b): rank 0 saves after each epoch (temporary name, then rename); every rank
    resumes from that file after a restart -- what a torchrun user writes by hand."""

    def __init__(self, ckpt_dir: str, rank: int, log: EventLog):
        self.path = os.path.join(ckpt_dir, "state.pt")
        self.rank = rank
        self.log = log

    def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
        if not os.path.exists(self.path):
            return 0
        return load_state(torch.load(self.path, weights_only=False), model, optimizer)

    def after_step(self, epoch: int, step: int, loss: float) -> None:
        pass

    def after_epoch(self, epoch: int, loss: float, state: dict[str, Any]) -> None:
        if self.rank != 0:
            return
        start = time.time()
        tmp = self.path + ".tmp"
        torch.save(state, tmp)
        os.replace(tmp, self.path)
        self.log.emit("save", dt=time.time() - start, epoch=epoch,
                      bytes=os.path.getsize(self.path))
