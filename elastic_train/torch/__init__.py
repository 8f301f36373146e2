"""``elastic_train.torch``: mirrors ``ray.train.torch``."""

from elastic_train.torch.config import TorchConfig
from elastic_train.torch.removed import accelerate, backward, prepare_optimizer
from elastic_train.torch.torch_trainer import TorchTrainer
from elastic_train.torch.train_loop_utils import (
    enable_reproducibility,
    get_device,
    get_devices,
    prepare_data_loader,
    prepare_model,
)

__all__ = [
    "TorchConfig",
    "TorchTrainer",
    "accelerate",
    "backward",
    "enable_reproducibility",
    "get_device",
    "get_devices",
    "prepare_data_loader",
    "prepare_model",
    "prepare_optimizer",
]
