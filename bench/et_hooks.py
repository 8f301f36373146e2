"""The report hooks, shared by (c) the ``TorchTrainer`` driver, (d) the script run
by ``elastic-train launch`` and (e) Ray Train (see :mod:`bench.train_api`):
``report()`` every epoch with a ``Checkpoint``, optionally a metrics-only
``report()`` every step, and resume from ``get_checkpoint()``.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

import torch

from bench.events import EventLog
from bench.train_api import train
from bench.workload import WorkloadConfig, load_state

STATE_FILE = "state.pt"


class ReportHooks:
    """``report()`` every epoch (with a checkpoint) and, with ``report_every="step"``,
    a metrics-only ``report()`` after each of the other steps too.

    Only rank 0 saves and passes a checkpoint, like (b) and Ray's DDP examples;
    the other ranks report the metrics alone (``report()`` is collective).
    """

    def __init__(self, cfg: WorkloadConfig, rank: int, log: EventLog):
        self.cfg = cfg
        self.rank = rank
        self.log = log
        self._step_reports_s = 0.0  # time in per-step report() calls this epoch
        self._step_reports = 0
        self._mode = train.CheckpointUploadMode(cfg.upload_mode)

    def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
        checkpoint = train.get_checkpoint()
        if checkpoint is None:
            return 0
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, STATE_FILE), weights_only=False)
        return load_state(state, model, optimizer)

    def after_step(self, epoch: int, step: int, loss: float) -> None:
        # The epoch's last step is reported by after_epoch, with the checkpoint.
        if self.cfg.report_every == "step" and step < self.cfg.steps_per_epoch - 1:
            start = time.time()
            train.report({"loss": loss, "epoch": epoch, "step": step})
            self._step_reports_s += time.time() - start
            self._step_reports += 1

    def after_epoch(self, epoch: int, loss: float, state: dict[str, Any]) -> None:
        if self._step_reports:
            self.log.emit("step_reports", dt=self._step_reports_s, n=self._step_reports,
                          epoch=epoch)
            self._step_reports_s, self._step_reports = 0.0, 0
        metrics = {"loss": loss, "epoch": epoch}
        if not state or self.rank != 0:
            start = time.time()
            train.report(metrics, checkpoint_upload_mode=self._mode)
            self.log.emit("report", dt=time.time() - start, epoch=epoch)
            return
        start = time.time()
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, STATE_FILE)
            torch.save(state, path)
            saved = time.time()
            size = os.path.getsize(path)  # an ASYNC asked for deletes the directory (Ray's)
            train.report(metrics, checkpoint=train.Checkpoint.from_directory(d),
                         checkpoint_upload_mode=self._mode)
            reported = time.time()
        # total: everything the loop waited for, removing the temporary directory included
        self.log.emit("save", dt=saved - start, epoch=epoch, bytes=size)
        self.log.emit("report", dt=reported - saved, total=time.time() - start, epoch=epoch)
