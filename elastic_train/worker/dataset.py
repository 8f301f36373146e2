"""Per-rank dataset shards: ``get_dataset_shard("train").iter_torch_batches(...)``.

A shard reshuffles a map-style torch ``Dataset`` each epoch with a permutation
drawn from ``(seed, epoch)`` (the same on every rank) and splits the part of it
not yet trained on across the ranks (every rank runs the same number of
batches, so collectives stay in step): :mod:`.data_position`. Its position is
stored with each checkpoint: a resumed run continues at the same epoch and
batch as an uninterrupted one, and a run resumed at another world size trains
on the rest of the epoch, each row once.

Ray Data shuffles only on request and its order is not reproducible; here a
shard shuffles by default and always reproducibly (``shuffle=False`` keeps the
dataset's order).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import Dataset, default_collate

from elastic_train.errors import ConfigError
from elastic_train.worker import heartbeat
from elastic_train.worker.data_position import (
    Done,
    EpochPosition,
    Resumed,
    epoch_order,
    share,
)

# Ray Data's names for what a shard does under another name: the way to it
_RAY_DATA_NAMES = {
    "iter_batches": "iter_torch_batches(batch_size=...), whose batches are torch tensors "
                    "(Ray Data's batches of NumPy arrays are not made here).",
}


class DatasetShard:
    """This rank's share of a dataset passed as ``TorchTrainer(datasets={...})``."""

    def __init__(self, dataset: Dataset, rank: int, world_size: int,
                 device: torch.device, default_seed: Callable[[], int]):
        self.dataset = dataset
        self.rank = rank
        self.world_size = world_size
        self.position = EpochPosition(rank, world_size)
        self._device = device
        self._default_seed = default_seed

    def __getattr__(self, name: str) -> Any:
        if name in _RAY_DATA_NAMES:
            raise AttributeError(f"DatasetShard has no {name}() (Ray Data's name): use "
                                 f"{_RAY_DATA_NAMES[name]}")
        raise AttributeError(f"'DatasetShard' object has no attribute {name!r}")

    @property
    def epoch(self) -> int:
        return self.position.epoch

    def state_dict(self) -> dict[str, Any]:
        return self.position.state_dict()

    def restore(self, states: Mapping[int, Mapping[str, Any]]) -> Resumed | None:
        return self.position.restore(states)

    def count(self) -> int:
        """Rows this rank gets in a whole epoch (ranks differ by at most one)."""
        return len(share(Done().rest(len(self.dataset)),  # type: ignore[arg-type]
                         self.world_size, self.rank))

    def iter_torch_batches(
        self,
        *,
        batch_size: int = 256,
        dtypes: torch.dtype | dict[str, torch.dtype] | None = None,
        device: str | torch.device = "auto",
        collate_fn: Callable[[list[Any]], Any] | None = None,
        drop_last: bool = False,
        shuffle: bool = True,
        seed: int | None = None,
        prefetch_batches: int = 1,
        local_shuffle_buffer_size: int | None = None,
        local_shuffle_seed: int | None = None,
    ) -> Iterator[Any]:
        """One epoch of batches of this rank's rows.

        Args:
            batch_size: Rows per batch (Ray's default, 256).
            dtypes: Cast floating/int tensors to this dtype (or per-key dtypes
                for dict batches).
            device: ``"auto"`` moves batches to this worker's device.
            collate_fn: Builds a batch from a list of rows (default: torch's
                ``default_collate``).
            drop_last: Drop the samples that do not fill a step of full batches on
                every rank (otherwise the last batches may be smaller).
            shuffle: Reshuffle every epoch (reproducibly).
            seed: Base seed of the shuffle (default: the seed given to
                ``enable_reproducibility``, else 0).
            prefetch_batches: Accepted for Ray scripts; rows come from an
                in-process torch Dataset here, so there is nothing to prefetch.
            local_shuffle_buffer_size: Accepted for Ray scripts: every epoch is
                already a full reshuffle of the dataset, which a local buffer
                only approximates.
            local_shuffle_seed: Ray's name for ``seed``.

        Example::

            shard = elastic_train.get_dataset_shard("train")
            for epoch in range(epochs):
                for x, y in shard.iter_torch_batches(batch_size=64):
                    ...

        Resuming from a checkpoint reported inside the loop continues the
        epoch at the next batch (at another world size: the rows of the epoch
        not trained on yet, split over the new ranks). Once the epoch's last
        batch was handed out the pass is finished, whether or not the iterator
        was asked for its end (``zip`` does not ask): a checkpoint reported then
        (a just-in-time one, or every k batches) resumes at the next epoch, as
        one reported after the loop; save ``epoch + 1`` with it then
        (``state_dict()["finished"]`` says so). See docs/elastic-data.md.
        """
        _check_batch_size(batch_size)
        if prefetch_batches < 0 or (local_shuffle_buffer_size or 0) < 0:
            raise ValueError(
                f"iter_torch_batches(prefetch_batches={prefetch_batches!r}, "
                f"local_shuffle_buffer_size={local_shuffle_buffer_size!r}): use values >= 0.")
        seed = local_shuffle_seed if seed is None else seed
        target = self._device if device == "auto" else torch.device(device)
        return self._batches(shuffle, seed, batch_size, drop_last,
                             collate_fn or default_collate, target, dtypes)

    def _batches(self, shuffle: bool, seed: int | None, batch_size: int, drop_last: bool,
                 collate: Callable[[list[Any]], Any], target: torch.device,
                 dtypes: Any) -> Iterator[Any]:
        """The epoch's batches, from where a restored position left off."""
        position = self.position
        position.begin_pass()  # first: it decides the epoch, which the order depends on
        n = len(self.dataset)  # type: ignore[arg-type]
        order = epoch_order(n, shuffle, self._default_seed() if seed is None else seed,
                            position.epoch)
        for planned in position.batches(n, batch_size, drop_last):
            batch = _to(collate([self.dataset[i] for i in order[planned.places].tolist()]),
                        target, dtypes)
            position.took(planned)
            heartbeat.beat()
            yield batch
        position.end_pass()


def _check_batch_size(batch_size: Any) -> None:
    """A ConfigError naming ``batch_size`` unless it is a positive int."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"iter_torch_batches(batch_size={batch_size!r}): pass a "
                          "positive int number of rows per batch, e.g. batch_size=64.")


def _to(batch: Any, device: torch.device, dtypes: Any, key: str | None = None) -> Any:
    """Moves (and optionally casts) every tensor in a nested batch."""
    if isinstance(batch, torch.Tensor):
        dtype = dtypes.get(key) if isinstance(dtypes, dict) else dtypes
        return batch.to(device=device, dtype=dtype, non_blocking=True)
    if isinstance(batch, dict):
        return {k: _to(v, device, dtypes, k) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to(v, device, dtypes, key) for v in batch)
    return batch
