"""Ray Train's PyTorch Lightning guide with the imports changed, on scikit-learn's digits.

Ray's guide trains a ResNet18 on FashionMNIST; this is the same script on data
that ships inside scikit-learn (an MLP on 8x8 digits), so it runs offline in
seconds: 2 workers, a checkpoint every epoch, resume after a failure, > 90 %
validation accuracy.

    python examples/lightning_digits.py --num-workers 2 --epochs 5 --storage-path /tmp/results

Works with ``import lightning.pytorch as pl`` or ``import pytorch_lightning as pl``.
"""

from __future__ import annotations

import argparse
import os

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, TensorDataset

try:
    import lightning.pytorch as pl
except ImportError:
    import pytorch_lightning as pl

import elastic_train
import elastic_train.lightning
from elastic_train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from elastic_train.torch import TorchTrainer


def digits_datasets() -> tuple[TensorDataset, TensorDataset]:
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    x_train, x_val, y_train, y_val = train_test_split(x, y, test_size=0.2, random_state=0,
                                                      stratify=y)
    return TensorDataset(x_train, y_train), TensorDataset(x_val, y_val)


class DigitsClassifier(pl.LightningModule):
    def __init__(self, lr: float = 1e-3):
        super().__init__()
        self.model = torch.nn.Sequential(
            torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
        self.criterion = torch.nn.CrossEntropyLoss()
        self.lr = lr

    def forward(self, x):
        return self.model(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = self.criterion(self(x), y)
        self.log("loss", loss, on_step=True, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        accuracy = (self(x).argmax(dim=1) == y).float().mean()
        self.log("val_accuracy", accuracy, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.model.parameters(), lr=self.lr)


def train_func(config: dict) -> None:
    # Data
    train_set, val_set = digits_datasets()
    train_loader = DataLoader(train_set, batch_size=32, shuffle=True)
    val_loader = DataLoader(val_set, batch_size=256)

    # Training
    model = DigitsClassifier(lr=config.get("lr", 1e-3))
    # [1] Configure PyTorch Lightning Trainer.
    trainer = pl.Trainer(
        max_epochs=config["epochs"],
        devices="auto",
        accelerator="auto",
        strategy=elastic_train.lightning.RayDDPStrategy(),
        plugins=[elastic_train.lightning.RayLightningEnvironment()],
        callbacks=[elastic_train.lightning.RayTrainReportCallback(),
                   *config.get("callbacks", [])],
        enable_checkpointing=False,  # RayTrainReportCallback checkpoints every epoch
        enable_progress_bar=False,
        logger=False,
    )
    trainer = elastic_train.lightning.prepare_trainer(trainer)

    # Resume from the latest checkpoint after a failure (Lightning restores the
    # model, the optimizer and the loops).
    checkpoint = elastic_train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            name = elastic_train.lightning.RayTrainReportCallback.CHECKPOINT_NAME
            trainer.fit(model, train_dataloaders=train_loader, val_dataloaders=val_loader,
                        ckpt_path=os.path.join(d, name))
    else:
        trainer.fit(model, train_dataloaders=train_loader, val_dataloaders=val_loader)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--storage-path", default=None)
    parser.add_argument("--name", default="lightning_digits")
    args = parser.parse_args()

    # [2] Configure scaling and resource requirements. [3] Launch distributed training job.
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"epochs": args.epochs, "lr": 3e-3},
        scaling_config=ScalingConfig(num_workers=args.num_workers),
        run_config=RunConfig(
            name=args.name, storage_path=args.storage_path, start_over=True,
            failure_config=FailureConfig(max_failures=2),
            checkpoint_config=CheckpointConfig(num_to_keep=2,
                                               checkpoint_score_attribute="val_accuracy"),
        ),
    )
    result = trainer.fit()
    print(f"val_accuracy {result.metrics['val_accuracy']:.3f} after {result.metrics['epoch'] + 1} "
          f"epochs; checkpoint {result.checkpoint.path}")


if __name__ == "__main__":
    main()
