"""``prepare_trainer``: checks a ``transformers.Trainer`` against this worker's set-up."""

from __future__ import annotations

import inspect
from typing import Any

from elastic_train.errors import ConfigError
from elastic_train.torch.train_loop_utils import get_device


def _check_dataset(name: str, dataset: Any) -> None:
    if inspect.isgenerator(dataset):
        raise ConfigError(
            f"prepare_trainer(): the Trainer's {name} is a generator (such as "
            "get_dataset_shard(...).iter_torch_batches()), which the Trainer can read only "
            "once. Pass the torch Dataset itself: the Trainer splits it across the ranks.")


def prepare_trainer(trainer: Any) -> Any:
    """Returns ``trainer`` after checking it fits this worker (Ray's name).

    Ray's version wraps Ray Data iterables; here datasets are torch (or
    Hugging Face) datasets that the Trainer itself splits across the ranks,
    so this only checks:

    - ``train_dataset`` / ``eval_dataset`` are not one-pass generators;
    - the Trainer uses this worker's device (the Trainer picks
      ``cuda:LOCAL_RANK``; with fractional GPUs, ``resources_per_worker={"GPU":
      0.5}``, ranks share devices and the two differ).

    Raises:
        ConfigError: naming the mismatch and the fix.
    """
    _check_dataset("train_dataset", trainer.train_dataset)
    _check_dataset("eval_dataset", trainer.eval_dataset)
    device, ours = trainer.args.device, get_device()
    if device.type != ours.type or (ours.index is not None and device.index != ours.index):
        raise ConfigError(
            f"prepare_trainer(): the Trainer runs on {device} but this worker's device is "
            f"{ours}. Use whole GPUs per worker (ScalingConfig(use_gpu=True) without a "
            "fractional resources_per_worker['GPU']), or TrainingArguments(use_cpu=True) "
            "with use_gpu=False.")
    return trainer
