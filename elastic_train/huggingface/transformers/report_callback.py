"""``RayTrainReportCallback`` for ``transformers.Trainer``: a report at every save."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import torch.distributed as dist
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from elastic_train.checkpoint import Checkpoint
from elastic_train.worker.session import report


class RayTrainReportCallback(TrainerCallback):
    """After each checkpoint the Trainer saves, reports the merged entries of
    ``state.log_history`` and that checkpoint, under ``CHECKPOINT_NAME`` (Ray's
    name and layout)::

        checkpoint_000003/
            checkpoint/          the Trainer's checkpoint-N directory

    Save, log and evaluate at the same frequency (e.g. all ``"epoch"``) so
    that the metrics reported with a checkpoint are its own. Resume with::

        checkpoint = elastic_train.get_checkpoint()
        if checkpoint:
            with checkpoint.as_directory() as d:
                trainer.train(resume_from_checkpoint=os.path.join(
                    d, RayTrainReportCallback.CHECKPOINT_NAME))
        else:
            trainer.train()

    Where we differ from Ray: the checkpoint reported is the one of this save
    (``checkpoint-<global_step>``), not the highest-numbered directory in
    ``output_dir``, which can be a leftover of an earlier run there (resuming
    from it would skip the training); and every rank first waits for the
    others to finish writing the save (the Trainer saves per-rank RNG states
    into the same directory, with no barrier before this hook), so no rank
    copies a file that is still being written.
    """

    CHECKPOINT_NAME = "checkpoint"

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        metrics: dict[str, Any] = {}
        for entry in state.log_history:
            metrics.update(entry)
        saved = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        if not os.path.isdir(saved):  # not on this rank's disk
            saved = None
        with tempfile.TemporaryDirectory(prefix="elastic_train_transformers_") as directory:
            checkpoint = None
            if saved is not None:
                shutil.copytree(saved, os.path.join(directory, self.CHECKPOINT_NAME))
                checkpoint = Checkpoint.from_directory(directory)
            report(metrics, checkpoint=checkpoint)
