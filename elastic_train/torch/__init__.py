"""``elastic_train.torch``: mirrors ``ray.train.torch``, plus our additions: a reader for
sharded (``torch.distributed.checkpoint``) checkpoints and ``async_save``, a checkpoint
written by a separate process while training goes on."""

from typing import TYPE_CHECKING, Any

from elastic_train.torch.config import TorchConfig
from elastic_train.torch.live_state import LiveState
from elastic_train.torch.removed import accelerate, backward, prepare_optimizer
from elastic_train.torch.torch_trainer import TorchTrainer
from elastic_train.torch.train_loop_utils import (
    enable_reproducibility,
    get_device,
    get_devices,
    prepare_data_loader,
    prepare_model,
)

if TYPE_CHECKING:
    from elastic_train.storage.dcp import CheckpointReader
    from elastic_train.torch.background_save import async_save

__all__ = [
    "CheckpointReader",
    "LiveState",
    "TorchConfig",
    "TorchTrainer",
    "accelerate",
    "async_save",
    "backward",
    "enable_reproducibility",
    "get_device",
    "get_devices",
    "prepare_data_loader",
    "prepare_model",
    "prepare_optimizer",
]


def __getattr__(name: str) -> Any:
    # Loaded on first use: they import torch.distributed.checkpoint, which most runs never need.
    if name == "CheckpointReader":
        from elastic_train.storage.dcp import CheckpointReader

        return CheckpointReader
    if name == "async_save":
        from elastic_train.torch.background_save import async_save

        return async_save
    raise AttributeError(f"module 'elastic_train.torch' has no attribute {name!r}")
