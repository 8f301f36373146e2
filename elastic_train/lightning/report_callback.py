"""``RayTrainReportCallback`` for Lightning: a report and a checkpoint every epoch."""

from __future__ import annotations

import os
import tempfile
from types import ModuleType
from typing import Any

import torch

from elastic_train.checkpoint import Checkpoint
from elastic_train.lightning.flavour import LightningBound
from elastic_train.worker.session import report


def scalar_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """One-element tensors as numbers; other values as they are."""
    return {k: v.item() if isinstance(v, torch.Tensor) and v.numel() == 1 else v
            for k, v in metrics.items()}


class RayTrainReportCallback(LightningBound):
    """At the end of every training epoch, reports ``trainer.callback_metrics``
    (plus ``epoch`` and ``step``) and a checkpoint holding Lightning's own
    checkpoint file, ``CHECKPOINT_NAME`` (Ray's name and layout)::

        checkpoint_000003/
            checkpoint.ckpt

    Every rank saves into a directory of its own and reports it; the files
    of all ranks are merged into one checkpoint (Lightning writes a single
    file from rank 0, sharded strategies one file per rank). Resume with::

        checkpoint = elastic_train.get_checkpoint()
        if checkpoint:
            with checkpoint.as_directory() as d:
                trainer.fit(model, datamodule=dm,
                            ckpt_path=os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME))
        else:
            trainer.fit(model, datamodule=dm)
    """

    CHECKPOINT_NAME = "checkpoint.ckpt"

    @staticmethod
    def _lightning_base(pl: ModuleType) -> type:
        return pl.callbacks.Callback

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        metrics = scalar_metrics(dict(trainer.callback_metrics))
        metrics["epoch"] = trainer.current_epoch
        metrics["step"] = trainer.global_step
        with tempfile.TemporaryDirectory(prefix="elastic_train_lightning_") as directory:
            trainer.save_checkpoint(os.path.join(directory, self.CHECKPOINT_NAME),
                                    weights_only=False)
            report(metrics, checkpoint=Checkpoint.from_directory(directory))
