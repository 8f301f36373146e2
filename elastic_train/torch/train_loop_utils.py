"""Worker-side helpers of ``elastic_train.torch``: model and data loader preparation,
devices and reproducibility (mirrors ``ray.train.torch``)."""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

from elastic_train.errors import ConfigError
from elastic_train.worker import heartbeat
from elastic_train.worker.dataset import ResumableIterable, _to
from elastic_train.worker.session import get_session

logger = logging.getLogger(__name__)


def get_device() -> torch.device:
    """This worker's (first) device: ``cuda:N`` with GPUs, else ``cpu``."""
    return get_session().resources.devices[0]


def get_devices() -> list[torch.device]:
    """All devices of this worker (several when ``resources_per_worker['GPU'] > 1``)."""
    return list(get_session().resources.devices)


def enable_reproducibility(seed: int = 0) -> None:
    """Seeds Python, NumPy and torch, and makes torch pick deterministic kernels.

    The seed also drives the per-epoch shuffles of dataset shards and prepared
    data loaders, so a resumed run sees the same batches as an uninterrupted one.
    """
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    get_session().seed = seed


def prepare_model(model: torch.nn.Module, move_to_device: bool | torch.device = True,
                  parallel_strategy: str | None = "ddp",
                  parallel_strategy_kwargs: dict[str, Any] | None = None) -> torch.nn.Module:
    """Moves the model to this worker's device and wraps it for data parallelism.

    With one worker the model is returned unwrapped, as in Ray.

    Args:
        move_to_device: True for this worker's device, a device, or False.
        parallel_strategy: ``"ddp"`` (DistributedDataParallel), ``"fsdp"``
            (FullyShardedDataParallel) or None.
        parallel_strategy_kwargs: Passed to the wrapper's constructor.
    """
    if parallel_strategy not in ("ddp", "fsdp", None):
        raise ConfigError(f"prepare_model(parallel_strategy={parallel_strategy!r}): use "
                          "'ddp', 'fsdp' or None.")
    device = get_device() if move_to_device is True else move_to_device
    if device:
        model = model.to(device)
    if parallel_strategy is None or not dist.is_initialized() or dist.get_world_size() == 1:
        return model
    kwargs = dict(parallel_strategy_kwargs or {})
    on_gpu = isinstance(device, torch.device) and device.type == "cuda"
    if parallel_strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        if on_gpu:
            kwargs.setdefault("device_ids", [device])
            kwargs.setdefault("output_device", device)
        return DistributedDataParallel(model, **kwargs)
    from torch.distributed.fsdp import FullyShardedDataParallel

    if on_gpu:
        kwargs.setdefault("device_id", device)
    return FullyShardedDataParallel(model, **kwargs)


class _PreparedDataLoader(ResumableIterable):
    """A data loader whose sampler epoch advances by itself and whose batches move
    to the worker's device; its epoch (and batch, mid-epoch) is resumable."""

    def __init__(self, loader: DataLoader, device: torch.device | None):
        super().__init__()
        self.loader = loader
        self.device = device

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["loader"], name)

    def __iter__(self) -> Iterator[Any]:
        skip = self._begin_pass()
        sampler = self.loader.sampler
        if isinstance(sampler, DistributedSampler):
            sampler.set_epoch(self.epoch)
        for number, batch in enumerate(self.loader):
            if number < skip:
                continue
            self.batch = number + 1
            heartbeat.beat()
            yield _to(batch, self.device, None) if self.device is not None else batch
        self._end_pass()


def prepare_data_loader(data_loader: DataLoader, add_dist_sampler: bool = True,
                        move_to_device: bool = True, auto_transfer: bool = True
                        ) -> _PreparedDataLoader:
    """Shards a DataLoader across workers and moves its batches to this worker's device.

    A ``DistributedSampler`` replaces the loader's sampler (shuffling iff the
    original shuffled, seeded by ``enable_reproducibility``); its epoch is set
    on every pass, so users need not call ``set_epoch``. ``auto_transfer``
    (Ray's CUDA-stream prefetch) is accepted; batches are copied with
    ``non_blocking=True`` either way.
    """
    session = get_session()
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    loader = data_loader
    if add_dist_sampler and world_size > 1 and not isinstance(loader.sampler, DistributedSampler):
        shuffle = isinstance(loader.sampler, RandomSampler)
        sampler = DistributedSampler(loader.dataset, num_replicas=world_size,
                                     rank=dist.get_rank(), shuffle=shuffle, seed=session.seed)
        loader = DataLoader(
            loader.dataset, batch_size=loader.batch_size, sampler=sampler,
            num_workers=loader.num_workers, collate_fn=loader.collate_fn,
            pin_memory=loader.pin_memory, drop_last=loader.drop_last,
            timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
            persistent_workers=loader.persistent_workers,
        )
    device = get_device() if move_to_device else None
    prepared = _PreparedDataLoader(loader, device)
    session.register_resumable(session.next_loader_key(), prepared)
    return prepared
