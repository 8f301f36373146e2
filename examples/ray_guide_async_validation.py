"""Ray Train's asynchronous validation guide with the imports changed, on scikit-learn's digits.

Ray's guide ("Validating checkpoints asynchronously") validates each checkpoint in a
Ray task while training goes on; here the validation function runs in a process of
its own on rank 0's node. It shows two validation functions, both here:

- ``validation_fn``: loads ``model.pt`` from the checkpoint and scores it on the
  validation set (the guide's simple one);
- ``distributed_validation_fn``: runs a ``TorchTrainer`` of its own on 2 workers
  whose train function only evaluates (the guide's "distributed validation
  function"; it needs ``torchmetrics``).

and the train function that reports each epoch's checkpoint with
``validation=ValidationTaskConfig(fn_kwargs={...})``. What differs from the guide
besides the imports, and why:

- data: Ray Data datasets become map-style torch datasets of dict rows (the
  digits that ship inside scikit-learn: offline, seconds), read with
  ``get_dataset_shard(...).iter_torch_batches`` or a ``DataLoader``;
- ``use_gpu=True`` is ``--use-gpu`` (CPU here); the guide's ``accelerator_type``
  stays, accepted and ignored with one warning at ``fit()``, and so do the Ray task
  options this port adds as a Ray script would carry them (``ray_remote_kwargs``:
  ``num_cpus`` ignored, ``num_gpus`` honoured as rank 0's GPU);
- the model is an MLP on 8x8 digits; Ray's guide leaves it as ``...``;
- ``result.return_values`` in the guide is ``result.return_value`` (Ray's own
  ``Result`` has no ``return_values`` either).

    python examples/ray_guide_async_validation.py --storage-path /tmp/results
    python examples/ray_guide_async_validation.py --distributed-validation
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import DataLoader, Dataset

import elastic_train  # was: import ray.train
import elastic_train.torch  # was: import ray.train.torch
from elastic_train import ValidationConfig, ValidationTaskConfig  # was: from ray.train import


class DigitsRows(Dataset):
    """scikit-learn's digits as rows ``{"image": 64 floats, "label": int}`` (the guide's
    Ray Data rows); ``split`` "train" or "validation"."""

    def __init__(self, split: str):
        digits = load_digits()
        x_train, x_val, y_train, y_val = train_test_split(
            digits.data / 16.0, digits.target, test_size=0.25, random_state=0,
            stratify=digits.target)
        x, y = (x_train, y_train) if split == "train" else (x_val, y_val)
        self.images = torch.tensor(x, dtype=torch.float32)
        self.labels = torch.tensor(y, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"image": self.images[i], "label": self.labels[i]}


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


# Defined outside the validation function, as in the guide: fn_kwargs must be JSON.
validation_dataset = DigitsRows("validation")


def validation_fn(checkpoint: elastic_train.Checkpoint) -> dict:
    # Load the checkpoint
    model = build_model()
    with checkpoint.as_directory() as checkpoint_dir:
        model_state_dict = torch.load(os.path.join(checkpoint_dir, "model.pt"))
        model.load_state_dict(model_state_dict)
    model.eval()

    # Perform validation on the data
    total_accuracy = 0
    with torch.no_grad():
        for batch in DataLoader(validation_dataset, batch_size=128):
            images, labels = batch["image"], batch["label"]
            outputs = model(images)
            total_accuracy += (outputs.argmax(1) == labels).sum().item()
    return {"score": total_accuracy / len(validation_dataset)}


def eval_only_train_fn(config_dict: dict) -> dict:
    import torchmetrics

    # Load the checkpoint
    model = build_model()
    with config_dict["checkpoint"].as_directory() as checkpoint_dir:
        model_state_dict = torch.load(os.path.join(checkpoint_dir, "model.pt"))
        model.load_state_dict(model_state_dict)
    device = elastic_train.torch.get_device()
    model.to(device).eval()

    # Set up metrics and data loaders
    criterion = nn.CrossEntropyLoss()
    mean_valid_loss = torchmetrics.MeanMetric().to(device)
    test_data_shard = elastic_train.get_dataset_shard("validation")
    test_dataloader = test_data_shard.iter_torch_batches(batch_size=128)

    # Compute metric and return it directly from the train function
    with torch.no_grad():
        for batch in test_dataloader:
            images, labels = batch["image"], batch["label"]
            outputs = model(images)
            loss = criterion(outputs, labels)
            mean_valid_loss(loss)
    return {"score": mean_valid_loss.compute().item()}


def distributed_validation_fn(checkpoint: elastic_train.Checkpoint, train_run_name: str,
                              epoch: int) -> dict:
    trainer = elastic_train.torch.TorchTrainer(
        eval_only_train_fn,
        train_loop_config={"checkpoint": checkpoint},
        scaling_config=elastic_train.ScalingConfig(num_workers=2, accelerator_type="A10G"),
        # Name validation run to easily associate it with training run
        run_config=elastic_train.RunConfig(
            name=f"{train_run_name}_validation_epoch_{epoch}"
        ),
        datasets={"validation": validation_dataset},
    )
    result = trainer.fit()
    # return_value holds the return value of the train function from worker 0
    return result.return_value


def train_func(config: dict) -> None:
    epochs = config["epochs"]
    model = elastic_train.torch.prepare_model(build_model())
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    criterion = nn.CrossEntropyLoss()
    rank = elastic_train.get_context().get_world_rank()
    shard = elastic_train.get_dataset_shard("train")
    for epoch in range(epochs):
        for batch in shard.iter_torch_batches(batch_size=32):  # training step
            loss = criterion(model(batch["image"]), batch["label"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank == 0:
            training_metrics = {"loss": loss.item(), "epoch": epoch}
            local_checkpoint_dir = tempfile.mkdtemp()
            torch.save(
                model.module.state_dict(),
                os.path.join(local_checkpoint_dir, "model.pt"),
            )
            elastic_train.report(
                training_metrics,
                checkpoint=elastic_train.Checkpoint.from_directory(local_checkpoint_dir),
                checkpoint_upload_mode=elastic_train.CheckpointUploadMode.ASYNC,
                validation=ValidationTaskConfig(fn_kwargs={
                    "train_run_name": elastic_train.get_context().get_experiment_name(),
                    "epoch": epoch,
                }) if config["distributed_validation"] else True,
            )
        else:
            elastic_train.report({}, None)


def run_trainer(epochs: int = 5, distributed_validation: bool = False,
                run_config: elastic_train.RunConfig | None = None,
                use_gpu: bool = False) -> elastic_train.Result:
    train_dataset = DigitsRows("train")
    trainer = elastic_train.torch.TorchTrainer(
        train_func,
        train_loop_config={"epochs": epochs, "distributed_validation": distributed_validation},
        validation_config=ValidationConfig(
            fn=distributed_validation_fn if distributed_validation else validation_fn,
            # The distributed one only starts a trainer: its own task needs no CPU
            ray_remote_kwargs={"num_cpus": 0} if distributed_validation
            else {"num_cpus": 1, "num_gpus": int(use_gpu)}),
        # Pass training dataset in datasets arg to split it across training workers
        datasets={"train": train_dataset},
        scaling_config=elastic_train.ScalingConfig(
            num_workers=2,
            use_gpu=use_gpu,
            # Use powerful GPUs for training
            accelerator_type="A100",
        ),
        run_config=run_config,
    )
    return trainer.fit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--storage-path", default=None)
    parser.add_argument("--distributed-validation", action="store_true")
    parser.add_argument("--use-gpu", action="store_true")
    args = parser.parse_args()
    result = run_trainer(args.epochs, args.distributed_validation, elastic_train.RunConfig(
        name="async_validation", storage_path=args.storage_path, start_over=True),
        args.use_gpu)
    for row in result.metrics_dataframe[["epoch", "loss", "score"]].itertuples(index=False):
        print(f"epoch {row.epoch}: loss {row.loss:.3f}, validation score {row.score:.3f}")


if __name__ == "__main__":
    main()
