"""Ray Train's getting-started example (ResNet18 on FashionMNIST), ported to elastic-train.

The only change to the training code is ``ray.train`` -> ``elastic_train``. Two
additions make it run anywhere: when FashionMNIST cannot be downloaded (no
network), it trains on torchvision's ``FakeData`` of the same shape and says
so; and ``--epochs``/``--num-workers``/``--fake-size`` keep a CPU run short.

    python examples/fashion_mnist_resnet.py --epochs 1 --fake-size 512
"""

import argparse
import os
import tempfile

import torch
from torch.nn import CrossEntropyLoss
from torch.optim import Adam
from torch.utils.data import DataLoader
from torchvision.datasets import FakeData, FashionMNIST
from torchvision.models import resnet18
from torchvision.transforms import Compose, Normalize, ToTensor

import elastic_train
import elastic_train.torch


def load_fashion_mnist(transform, fake_size):
    data_dir = os.path.join(tempfile.gettempdir(), "data")
    try:
        return FashionMNIST(root=data_dir, train=True, download=True, transform=transform)
    except Exception as exc:  # no network: the same shapes, generated
        if elastic_train.get_context().get_world_rank() == 0:
            print(f"FashionMNIST could not be loaded ({type(exc).__name__}); "
                  f"training on FakeData of {fake_size} 1x28x28 images instead.")
        return FakeData(size=fake_size, image_size=(1, 28, 28), num_classes=10,
                        transform=transform, random_offset=0)


def train_func(config):
    # Model, Loss, Optimizer
    model = resnet18(num_classes=10)
    model.conv1 = torch.nn.Conv2d(
        1, 64, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False
    )
    # model.to("cuda")  # This is done by `prepare_model`
    # [1] Prepare model.
    model = elastic_train.torch.prepare_model(model)
    criterion = CrossEntropyLoss()
    optimizer = Adam(model.parameters(), lr=0.001)

    # Data
    transform = Compose([ToTensor(), Normalize((0.5,), (0.5,))])
    train_data = load_fashion_mnist(transform, config["fake_size"])
    train_loader = DataLoader(train_data, batch_size=128, shuffle=True)
    # [2] Prepare dataloader.
    train_loader = elastic_train.torch.prepare_data_loader(train_loader)

    # Training
    for epoch in range(config["epochs"]):
        for images, labels in train_loader:
            # This is done by `prepare_data_loader`!
            # images, labels = images.to("cuda"), labels.to("cuda")
            outputs = model(images)
            loss = criterion(outputs, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        # [3] Report metrics and checkpoint.
        metrics = {"loss": loss.item(), "epoch": epoch}
        with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
            state_dict = model.module.state_dict() if hasattr(model, "module") \
                else model.state_dict()
            torch.save(state_dict, os.path.join(temp_checkpoint_dir, "model.pt"))
            elastic_train.report(
                metrics,
                checkpoint=elastic_train.Checkpoint.from_directory(temp_checkpoint_dir),
            )
        if elastic_train.get_context().get_world_rank() == 0:
            print(metrics)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--fake-size", type=int, default=1024)
    parser.add_argument("--storage-path", default=None)
    args = parser.parse_args()

    # [4] Configure scaling and resource requirements.
    use_gpu = torch.cuda.is_available()
    scaling_config = elastic_train.ScalingConfig(
        num_workers=args.num_workers,
        use_gpu=use_gpu,
        resources_per_worker={"GPU": 0.5} if use_gpu else None,
    )

    # [5] Launch distributed training job.
    trainer = elastic_train.torch.TorchTrainer(
        train_func,
        train_loop_config={"epochs": args.epochs, "fake_size": args.fake_size},
        scaling_config=scaling_config,
        run_config=elastic_train.RunConfig(storage_path=args.storage_path),
    )
    result = trainer.fit()

    # [6] Load the trained model.
    with result.checkpoint.as_directory() as checkpoint_dir:
        model_state_dict = torch.load(os.path.join(checkpoint_dir, "model.pt"))
        model = resnet18(num_classes=10)
        model.conv1 = torch.nn.Conv2d(
            1, 64, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False
        )
        model.load_state_dict(model_state_dict)
    print(f"Loaded the trained model from {result.checkpoint.path}")


if __name__ == "__main__":
    main()
