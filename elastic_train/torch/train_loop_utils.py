"""Worker-side helpers of ``elastic_train.torch``: model and data loader preparation,
devices and reproducibility (mirrors ``ray.train.torch``)."""

from __future__ import annotations

import contextlib
import logging
import os
import random
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)

from elastic_train.errors import ConfigError
from elastic_train.worker import heartbeat
from elastic_train.worker.data_position import (
    Batch,
    Done,
    EpochPosition,
    Resumed,
    accumulation_for,
    epoch_order,
    plan,
    steps_of,
)
from elastic_train.worker.dataset import _to
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


class ElasticSampler(DistributedSampler):
    """The sampler of a prepared data loader (``loader.sampler``): this rank's share of
    the epoch's seeded global order, from the position its loader resumed at (see
    :mod:`elastic_train.worker.data_position`). A torch ``DistributedSampler``, so code
    that checks for one or calls ``set_epoch`` keeps working.

    Unlike torch's, it splits only what the epoch has not trained on yet, and pads
    nothing unless ``even`` (torch's padding): the last batch of a rank may be one
    sample smaller than another rank's. ``accumulation`` micro-batches of
    ``batch_size`` make one optimizer step.
    """

    def __init__(self, dataset: Any, position: EpochPosition, shuffle: bool, seed: int,
                 batch_size: int, drop_last: bool, even: bool, accumulation: int = 1):
        super().__init__(dataset, num_replicas=position.world, rank=position.rank,
                         shuffle=shuffle, seed=seed, drop_last=drop_last)
        self.position = position
        self.batch_size = batch_size
        self.even = even
        self.accumulation = accumulation

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self.position.set_epoch(epoch)

    def _plan(self, done: Done) -> list[Batch]:
        return plan(done, len(self.dataset), self.num_replicas, self.rank,  # type: ignore[arg-type]
                    self.batch_size, self.drop_last, self.even, self.accumulation)

    def pass_batches(self) -> tuple[list[Batch], Iterator[list[int]]]:
        """The current pass's batches still to run, and the dataset's indices of each
        (made as the loader asks for them)."""
        n = len(self.dataset)  # type: ignore[arg-type]
        order = epoch_order(n, self.shuffle, self.seed, self.position.epoch)
        batches = self.position.batches(n, self.batch_size, self.drop_last, self.even,
                                        self.accumulation)
        return batches, (order[b.places].tolist() for b in batches)

    def __iter__(self) -> Iterator[int]:
        order = epoch_order(len(self.dataset), self.shuffle, self.seed,  # type: ignore[arg-type]
                            self.position.epoch)
        return (i for b in self._plan(Done()) for i in order[b.places].tolist())

    def __len__(self) -> int:
        return sum(len(b.places) for b in self._plan(Done()))

    def steps(self) -> int:
        """Batches per rank in a whole epoch (every rank runs as many; see ``plan``)."""
        step_size = self.num_replicas * self.accumulation * self.batch_size
        return steps_of(len(self.dataset), step_size,  # type: ignore[arg-type]
                        self.drop_last) * self.accumulation


class _PassBatches:
    """The loader's batch sampler: the batches its prepared loader set for this pass."""

    def __init__(self, sampler: ElasticSampler):
        self.sampler = sampler
        self.batches: Iterator[list[int]] = iter(())

    def __iter__(self) -> Iterator[list[int]]:
        return self.batches

    def __len__(self) -> int:
        return self.sampler.steps()


class _PreparedDataLoader:
    """A data loader whose batches move to the worker's device and whose position in the
    epoch is saved with each checkpoint (see :class:`ElasticSampler`).

    ``position`` is where it stands; ``untracked`` says why a loader's data cannot be
    split anew (an ``IterableDataset``, a batch sampler of the user's,
    ``add_dist_sampler=False``): such a loader resumes at the same world size by
    skipping the batches it already gave, and at another starts its epoch over, with a
    warning. ``loss_scale`` and ``sync_gradients`` describe the batch last handed out
    (see :func:`prepare_data_loader`).
    """

    def __init__(self, loader: DataLoader, device: torch.device | None,
                 position: EpochPosition, untracked: str | None = None,
                 global_batch_size: int | None = None):
        self.loader = loader
        self.global_batch_size = global_batch_size
        self.device = device
        self.position = position
        self.untracked = untracked
        # what users find as loader.sampler (set_epoch); a DataLoader's own is fixed
        self.sampler = loader.sampler if untracked else loader.batch_sampler.sampler
        self.loss_scale = 1.0
        self.sync_gradients = True

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["loader"], name)

    @property
    def accumulation_steps(self) -> int:
        """Micro-batches per optimizer step (1 without a ``global_batch_size``)."""
        return 1 if self.untracked else self.sampler.accumulation

    def state_dict(self) -> dict[str, Any]:
        return {**self.position.state_dict(), "untracked": self.untracked}

    def restore(self, states: Mapping[int, Mapping[str, Any]]) -> Resumed | None:
        resumed = self.position.restore(states)
        if resumed is not None and self.untracked:
            logger.warning(
                "This prepared data loader's data cannot follow the world size change "
                "(%d -> %d rank(s)): %s. Its epoch %d starts over on every rank, so the "
                "samples trained on before the change are trained on again. To train on "
                "each sample once per epoch, give prepare_data_loader a DataLoader of a "
                "map-style Dataset with its own sampler left to prepare_data_loader.",
                resumed.old_world, resumed.new_world, self.untracked, resumed.epoch)
            return None
        if resumed is not None and self.global_batch_size is not None:
            return replace(resumed, global_batch=self.global_batch_size,
                           accumulation=self.accumulation_steps)
        return resumed

    @contextlib.contextmanager
    def accumulate(self, model: torch.nn.Module) -> Iterator[None]:
        """Skips the gradient all-reduce of a micro-batch that does not end its optimizer
        step (DDP's ``no_sync``; FSDP2's ``set_requires_gradient_sync(False)``), as
        Hugging Face Accelerate's ``accumulate``. Wrap the forward and backward in it."""
        if self.sync_gradients:
            yield
        elif hasattr(model, "set_requires_gradient_sync"):  # FSDP2's fully_shard
            model.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)
        elif hasattr(model, "no_sync"):  # DDP, FSDP1
            with model.no_sync():
                yield
        else:  # one worker: nothing to all-reduce
            yield

    def __iter__(self) -> Iterator[Any]:
        self.position.begin_pass()
        if self.untracked:
            yield from self._replayed()
        else:
            planned, self.loader.batch_sampler.batches = self.sampler.pass_batches()
            for batch_plan, batch in zip(planned, self.loader, strict=True):
                self.position.took(batch_plan)
                self.loss_scale = batch_plan.loss_scale(self.position.world)
                self.sync_gradients = batch_plan.ends_step
                heartbeat.beat()
                yield self._moved(batch)
        self.position.end_pass()

    def _replayed(self) -> Iterator[Any]:
        """A loader whose data cannot be split anew: its batches, after the ones the
        resumed position says it gave (read and dropped: nothing else knows them)."""
        skip = self.position.batch
        self.position.batch = 0
        for number, batch in enumerate(self.loader):
            if number < skip:
                continue
            self.position.batch = number + 1
            heartbeat.beat()
            yield self._moved(batch)

    def _moved(self, batch: Any) -> Any:
        return _to(batch, self.device, None) if self.device is not None else batch


def _untracked_reason(loader: DataLoader, add_dist_sampler: bool) -> str | None:
    """Why ``loader``'s position cannot be tracked by sample, or None."""
    if isinstance(loader.dataset, IterableDataset):
        return f"its dataset ({type(loader.dataset).__name__}) is an IterableDataset"
    if loader.batch_size is None:
        return f"it has a batch sampler of its own ({type(loader.batch_sampler).__name__})"
    if not add_dist_sampler:
        return "prepare_data_loader(add_dist_sampler=False) keeps its own sampler"
    return None


def _shuffle_and_seed(sampler: Any, default_seed: int) -> tuple[bool, int, bool]:
    """What to keep of the loader's sampler: whether it shuffles, its seed, drop_last."""
    if isinstance(sampler, DistributedSampler):
        return sampler.shuffle, sampler.seed, sampler.drop_last
    if not isinstance(sampler, (RandomSampler, SequentialSampler)):
        logger.warning("prepare_data_loader replaces the loader's %s by a split of the "
                       "dataset in its order, as Ray Train does; pass "
                       "add_dist_sampler=False to keep it (its position then cannot follow "
                       "a change of the world size).", type(sampler).__name__)
    return isinstance(sampler, RandomSampler), default_seed, False


def prepare_data_loader(data_loader: DataLoader, add_dist_sampler: bool = True,
                        move_to_device: bool = True, auto_transfer: bool = True,
                        *, even_batches: bool = False,
                        global_batch_size: int | None = None) -> _PreparedDataLoader:
    """Shards a DataLoader across workers and moves its batches to this worker's device.

    The loader's sampler is replaced by an :class:`ElasticSampler` (a torch
    ``DistributedSampler``; shuffling iff the original shuffled, seeded by
    ``enable_reproducibility`` or by the seed of a ``DistributedSampler`` given), also
    with one worker; its epoch advances on every pass, so users need not call
    ``set_epoch``. Its position in the epoch goes with every checkpoint: a resume
    continues at the next batch, and at another world size the samples of the epoch not
    trained on yet are split over the new ranks, so each is trained on once per epoch
    (see docs/elastic-data.md). ``auto_transfer`` (Ray's CUDA-stream prefetch) is
    accepted; batches are copied with ``non_blocking=True`` either way.

    Args:
        even_batches: Where the samples left do not divide by the world size, give every
            rank as many by repeating samples (torch ``DistributedSampler``'s padding)
            instead of one sample fewer on some ranks. Not in Ray's API.
        global_batch_size: Keep each optimizer step at this many samples whatever the
            world size: the loader yields micro-batches (of at most its ``batch_size``),
            ``accumulation_steps`` of them per step. Wrap each micro-batch's forward and
            backward in ``loader.accumulate(model)``, scale its loss by
            ``loader.loss_scale``, and step the optimizer when ``loader.sync_gradients``
            (Accelerate's names). Report checkpoints after optimizer steps. Without it
            the global batch is ``batch_size`` times the world size, as in Ray. Not in
            Ray's API.

    Example::

        loader = prepare_data_loader(DataLoader(dataset, batch_size=32, shuffle=True),
                                     global_batch_size=64)
        for epoch in range(start, epochs):
            for x, y in loader:
                with loader.accumulate(model):
                    (loss_fn(model(x), y) * loader.loss_scale).backward()
                if loader.sync_gradients:
                    optimizer.step()
                    optimizer.zero_grad()
    """
    if not isinstance(data_loader, DataLoader):
        raise ConfigError(f"prepare_data_loader({type(data_loader).__name__}): pass a "
                          "torch.utils.data.DataLoader, e.g. prepare_data_loader("
                          "DataLoader(dataset, batch_size=32)).")
    session = get_session()
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    prepared = prepared_loader(data_loader, EpochPosition(rank, world_size), session.seed,
                               get_device() if move_to_device else None, add_dist_sampler,
                               even_batches, global_batch_size)
    session.register_resumable(session.next_loader_key(), prepared)
    return prepared


def prepared_loader(data_loader: DataLoader, position: EpochPosition, seed: int,
                    device: torch.device | None, add_dist_sampler: bool = True,
                    even_batches: bool = False, global_batch_size: int | None = None
                    ) -> _PreparedDataLoader:
    """:func:`prepare_data_loader`'s loader for the rank and world of ``position``,
    shuffled from ``seed`` unless a ``DistributedSampler`` of the user's names one."""
    untracked = _untracked_reason(data_loader, add_dist_sampler)
    if global_batch_size is not None and untracked:
        raise ConfigError(f"prepare_data_loader(global_batch_size={global_batch_size}) "
                          f"needs a loader whose data it splits, but {untracked}.")
    loader = data_loader
    if untracked is None:
        shuffle, seed, dist_drop_last = _shuffle_and_seed(loader.sampler, seed)
        accumulation, batch_size = (1, loader.batch_size) if global_batch_size is None \
            else accumulation_for(global_batch_size, position.world, loader.batch_size)
        sampler = ElasticSampler(loader.dataset, position, shuffle, seed, batch_size,
                                 loader.drop_last or dist_drop_last, even_batches,
                                 accumulation)
        loader = DataLoader(
            loader.dataset, batch_sampler=_PassBatches(sampler),
            num_workers=loader.num_workers, collate_fn=loader.collate_fn,
            pin_memory=loader.pin_memory, timeout=loader.timeout,
            worker_init_fn=loader.worker_init_fn,
            persistent_workers=loader.persistent_workers,
        )
    return _PreparedDataLoader(loader, device, position, untracked, global_batch_size)
