"""Worker-side helpers of ``elastic_train.torch``: model and data loader preparation,
devices and reproducibility (mirrors ``ray.train.torch``)."""

from __future__ import annotations

import contextlib
import inspect
import logging
import numbers
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
    check_global_batch,
    epoch_order,
    plan,
    steps_of,
)
from elastic_train.worker.dataset import _to
from elastic_train.worker.session import get_session
from elastic_train.worker.worker_plan import WorkerPlan

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
    """The loader's batch sampler: the batches its prepared loader set for this pass. Of a
    ``DataLoader(batch_size=None)`` (``unbatched``), its sampler: each batch's one index."""

    def __init__(self, sampler: ElasticSampler, unbatched: bool = False):
        self.sampler = sampler
        self.unbatched = unbatched
        self.batches: Iterator[list[int]] = iter(())

    def __iter__(self) -> Iterator[Any]:
        return (index for [index] in self.batches) if self.unbatched else self.batches

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
    (see :func:`prepare_data_loader`); ``options``: the arguments it was prepared with.
    """

    def __init__(self, loader: DataLoader, device: torch.device | None,
                 position: EpochPosition, untracked: str | None = None,
                 global_batch_size: int | None = None):
        self.loader = loader
        self.global_batch_size = global_batch_size
        self.device = device
        self.position = position
        self.untracked = untracked
        self.options: dict[str, Any] = {}  # prepare_data_loader's arguments
        # the batches of a pass go here (the batch sampler; batch_size=None: the sampler)
        self._passes = None if untracked else (
            loader.sampler if loader.batch_sampler is None else loader.batch_sampler)
        # what users find as loader.sampler (set_epoch); a DataLoader's own is fixed
        self.sampler = loader.sampler if untracked else self._passes.sampler
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
            planned, self._passes.batches = self.sampler.pass_batches()
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
        length = None if isinstance(self.loader.dataset, IterableDataset) else len(self.loader)
        for number, batch in enumerate(self.loader):
            if number < skip:
                continue
            self.position.batch = number + 1
            self.position.finished = self.position.batch == length
            heartbeat.beat()
            yield self._moved(batch)

    def _moved(self, batch: Any) -> Any:
        return _to(batch, self.device, None) if self.device is not None else batch


def _untracked_reason(loader: DataLoader, add_dist_sampler: bool) -> str | None:
    """Why ``loader``'s position cannot be tracked by sample, or None."""
    if isinstance(loader.dataset, IterableDataset):
        return f"its dataset ({type(loader.dataset).__name__}) is an IterableDataset"
    if loader.batch_sampler is not None and loader.batch_size is None:
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
    (see docs/elastic-data.md). The loader's other arguments are kept; one of
    ``batch_size=None`` is split item by item. ``auto_transfer`` (Ray's CUDA-stream
    prefetch) is accepted; batches are copied with ``non_blocking=True`` either way.

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
    options = {"add_dist_sampler": add_dist_sampler, "move_to_device": move_to_device,
               "even_batches": even_batches, "global_batch_size": global_batch_size}
    if isinstance(data_loader, _PreparedDataLoader):
        return _prepared_again(data_loader, options)
    if not isinstance(data_loader, DataLoader):
        raise ConfigError(f"prepare_data_loader({type(data_loader).__name__}): pass a "
                          "torch.utils.data.DataLoader, e.g. prepare_data_loader("
                          "DataLoader(dataset, batch_size=32)).")
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    global_batch_size = _checked_global_batch(global_batch_size, world_size)
    session = get_session()
    prepared = prepared_loader(data_loader, EpochPosition(rank, world_size), session.seed,
                               get_device() if move_to_device else None, add_dist_sampler,
                               even_batches, global_batch_size)
    prepared.options = options
    session.register_resumable(session.next_loader_key(), prepared)
    return prepared


def _job_world_sizes() -> tuple[int, ...]:
    """Every world size the job may run at, as its node run tells its workers (none
    outside a node run)."""
    plan = WorkerPlan.load()
    return plan.world_sizes if plan is not None else ()


def _prepared_again(prepared: _PreparedDataLoader, options: Mapping[str, Any]
                    ) -> _PreparedDataLoader:
    """``prepare_data_loader`` of a loader it already prepared: the same loader, if asked
    for with the same arguments (a second split would split its rank's share again)."""
    differ = [f"{name}={value!r} (prepared with {prepared.options[name]!r})"
              for name, value in options.items() if prepared.options.get(name) != value]
    if differ:
        raise ConfigError(f"prepare_data_loader(loader, {', '.join(differ)}): this loader "
                          "was already prepared with other arguments; pass "
                          "prepare_data_loader the DataLoader itself, once, with the "
                          "arguments you want.")
    logger.debug("prepare_data_loader of an already prepared loader: the same loader")
    return prepared


def _checked_global_batch(value: Any, world_size: int) -> int | None:
    """``global_batch_size`` as an int (None: not given), or a ConfigError naming it: a
    positive int that divides by this world size and every other the job may run at."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"prepare_data_loader(global_batch_size={value!r}): a "
                          f"{type(value).__name__}; pass an int number of samples per "
                          "optimizer step, e.g. global_batch_size=64.")
    if value < 1:
        raise ConfigError(f"prepare_data_loader(global_batch_size={value!r}): pass a "
                          "positive number of samples per optimizer step, e.g. "
                          "global_batch_size=64, or leave it out to let the global batch "
                          "follow the world size.")
    check_global_batch(int(value), [world_size, *_job_world_sizes()])
    return int(value)


def prepared_loader(data_loader: DataLoader, position: EpochPosition, seed: int,
                    device: torch.device | None, add_dist_sampler: bool = True,
                    even_batches: bool = False, global_batch_size: int | None = None
                    ) -> _PreparedDataLoader:
    """:func:`prepare_data_loader`'s loader for the rank and world of ``position``,
    shuffled from ``seed`` unless a ``DistributedSampler`` of the user's names one."""
    untracked = _untracked_reason(data_loader, add_dist_sampler)
    if global_batch_size is not None and (untracked or data_loader.batch_size is None):
        why = untracked or ("it has batch_size=None: it hands out each item of its "
                            "dataset as it is, so how many samples a step holds is not "
                            "known; give it a batch_size")
        raise ConfigError(f"prepare_data_loader(global_batch_size={global_batch_size}) "
                          f"needs a loader whose data it splits in batches, but {why}.")
    if untracked is not None:
        return _PreparedDataLoader(data_loader, device, position, untracked)
    sampler = _elastic_sampler(data_loader, position, seed, even_batches, global_batch_size)
    _refuse_empty_epochs(sampler, global_batch_size)
    unbatched = data_loader.batch_size is None
    passes = _PassBatches(sampler, unbatched)
    split = {"batch_size": None, "sampler": passes} if unbatched else {"batch_sampler": passes}
    loader = DataLoader(data_loader.dataset, **split, **_carried_options(data_loader))
    return _PreparedDataLoader(loader, device, position, None, global_batch_size)


def _elastic_sampler(loader: DataLoader, position: EpochPosition, seed: int, even: bool,
                     global_batch_size: int | None) -> ElasticSampler:
    """The split of ``loader``'s dataset for ``position``'s rank and world (one sample
    per batch where the loader has ``batch_size=None``)."""
    shuffle, seed, dist_drop_last = _shuffle_and_seed(loader.sampler, seed)
    batch_size = loader.batch_size or 1
    accumulation, batch_size = (1, batch_size) if global_batch_size is None \
        else accumulation_for(global_batch_size, position.world, batch_size)
    return ElasticSampler(loader.dataset, position, shuffle, seed, batch_size,
                          loader.drop_last or dist_drop_last, even, accumulation)


def _refuse_empty_epochs(sampler: ElasticSampler, global_batch_size: int | None) -> None:
    """A ConfigError for a loader whose ``drop_last`` drops every sample of every epoch:
    its dataset is smaller than one optimizer step."""
    if sampler.drop_last and sampler.steps() == 0:
        step = sampler.num_replicas * sampler.accumulation * sampler.batch_size
        how = f"global_batch_size={global_batch_size}" if global_batch_size else \
            f"batch_size={sampler.batch_size} on {sampler.num_replicas} rank(s)"
        raise ConfigError(
            f"prepare_data_loader: its {len(sampler.dataset)} samples are fewer than one "
            f"step of {step} ({how}), and drop_last=True drops them all: every epoch "
            "would be empty. Use a smaller batch, or drop_last=False.")


# what prepare_data_loader sets itself; every other DataLoader argument is carried over
_SET_BY_PREPARE = frozenset({"self", "dataset", "batch_size", "shuffle", "sampler",
                             "batch_sampler", "drop_last"})


def _carried_options(loader: DataLoader) -> dict[str, Any]:
    """Every other argument of torch's ``DataLoader`` as ``loader`` holds it (its workers'
    start method, prefetch, generator, pinning, ...), read from the signature so that an
    argument a newer torch adds is carried too."""
    return {name: getattr(loader, name)
            for name in inspect.signature(DataLoader.__init__).parameters
            if name not in _SET_BY_PREPARE}
