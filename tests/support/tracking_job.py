"""A train function that tracks with setup_mlflow() and setup_wandb() from the workers
(the e2e tracking test runs it with the driver-side callbacks as well)."""

from __future__ import annotations

import os
import tempfile

import torch

import elastic_train
from elastic_train import Checkpoint
from elastic_train.integrations.mlflow import setup_mlflow
from elastic_train.integrations.wandb import setup_wandb


def train(config: dict) -> None:
    mlflow = setup_mlflow(config, tracking_uri=config["mlflow_uri"], experiment_name="workers",
                          create_experiment_if_not_exists=True)
    run = setup_wandb(config, project="e2e-workers")
    shard = elastic_train.get_dataset_shard()  # Ray's default: the only dataset
    for epoch in range(config["epochs"]):
        rows = sum(len(x) for (x,) in shard.iter_torch_batches(batch_size=4))
        assert rows == config["rows_per_rank"], rows
        loss = 1.0 / (epoch + 1)
        mlflow.log_metric("worker_loss", loss, step=epoch)
        run.log({"worker_loss": loss})
        with tempfile.TemporaryDirectory() as directory:
            torch.save({"epoch": epoch}, os.path.join(directory, "state.pt"))
            elastic_train.report({"loss": loss, "nested": {"epoch": epoch}},
                                 checkpoint=Checkpoint.from_directory(directory))
    mlflow.end_run()
    run.finish()
