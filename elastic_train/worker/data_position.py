"""Where an epoch's data stands, whatever the world size.

A position is a fact about the epoch, not about a rank: which places of the epoch's
seeded global order are done (:class:`Done`). Each pass splits the places not yet done
among the ranks, round robin (rank ``r`` of ``W`` takes every ``W``-th, from its
``r``-th), and every rank runs the same number of steps. A checkpoint keeps each rank's
:class:`EpochPosition` (the epoch, what was done when the pass split, the world it
split over, and what the rank has taken since). A resume at the same world size goes on
with each rank's own share where it stopped, so it stays bit-identical; at another, the
ranks' shares are merged back into one :class:`Done` (:func:`merge`) and the rest of
the epoch is split over the new ranks. Every sample is then trained on once per epoch,
whatever sequence of shrinks and grows happens, and a resume seeks by index: nothing it
skips is read again.

What happens where the rest does not divide evenly (the tail of an epoch):

- by default (exactly once) ranks take one sample fewer or more, and a rank's last
  batches can be smaller than the others' (never empty while it has samples left);
- ``drop_last`` drops the samples that do not fill a step of ``W`` full batches
  (torch's ``drop_last``: up to ``W * batch_size - 1`` samples skipped per pass);
- ``even`` (torch ``DistributedSampler``'s padding) gives every rank the same number
  of samples by repeating the first samples of the rest on the ranks short of one.

Where a rank would have a step without any sample (fewer samples left than ranks, or
``batch_size=1`` with an uneven rest) it repeats one sample in that step, as torch's
padding does; padding is never counted as done.

Example::

    position = EpochPosition(rank=0, world=2)
    position.begin_pass()
    for places in position.batches(n=10, batch_size=2):
        position.took(places)   # after the batch was handed to the training loop
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch


def epoch_order(n: int, shuffle: bool, seed: int, epoch: int) -> torch.Tensor:
    """The epoch's global order of the dataset's ``n`` indices: a permutation drawn from
    ``seed + epoch`` (as torch's ``DistributedSampler``), or the dataset's order."""
    if not shuffle:
        return torch.arange(n)
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))


@dataclass(frozen=True)
class Done:
    """The places of an epoch's global order already trained on: every place below
    ``prefix`` and the places in ``beyond`` (each above ``prefix``, sorted)."""

    prefix: int = 0
    beyond: tuple[int, ...] = ()

    def rest(self, n: int) -> torch.Tensor:
        """The places of an order of ``n`` not done yet, in order."""
        places = torch.arange(self.prefix, n)
        if not self.beyond:
            return places
        keep = torch.ones(len(places), dtype=torch.bool)
        keep[torch.tensor(self.beyond) - self.prefix] = False
        return places[keep]

    def count(self) -> int:
        """How many places are done."""
        return self.prefix + len(self.beyond)


def share(rest: torch.Tensor, world: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s share of the places in ``rest``: every ``world``-th, from its own."""
    return rest[rank::world]


def steps_of(remaining: int, world: int, batch_size: int, drop_last: bool) -> int:
    """How many steps every rank runs to go through ``remaining`` samples."""
    if drop_last:
        return remaining // (world * batch_size)
    return math.ceil(math.ceil(remaining / world) / batch_size)


def batch_sizes(count: int, steps: int, batch_size: int) -> list[int]:
    """``count`` samples cut into ``steps`` batches of at most ``batch_size``: full ones
    first, then the rest spread so that no batch is empty while samples last (0: that
    step has none of this rank's samples left)."""
    sizes = []
    for step in range(steps):
        size = min(batch_size, max(count - (steps - step - 1), min(count, 1)))
        sizes.append(size)
        count -= size
    return sizes


def plan(done: Done, n: int, world: int, rank: int, batch_size: int,
         drop_last: bool = False, even: bool = False) -> list[torch.Tensor]:
    """Rank ``rank``'s batches (places of the epoch's order) for the rest of an epoch of
    ``n`` after ``done``, split over ``world`` ranks. Every rank gets as many batches;
    see the module's docstring for the tail."""
    rest = done.rest(n)
    steps = steps_of(len(rest), world, batch_size, drop_last)
    mine = share(rest, world, rank)
    if drop_last:
        mine = mine[: steps * batch_size]
    elif even and len(mine) < math.ceil(len(rest) / world) and len(rest):
        mine = torch.cat([mine, rest[:1]])  # torch's padding: a repeat of the rest's first
    batches, start = [], 0
    for size in batch_sizes(len(mine), steps, batch_size):
        if size == 0:  # no sample of this rank left for this step: repeat one (padding)
            batches.append(rest[:1] if len(rest) else torch.arange(0))
            continue
        batches.append(mine[start : start + size])
        start += size
    return batches


def merge(done: Done, n: int, world: int, taken: Mapping[int, int]) -> Done:
    """What is done once each rank ``r`` of a split of the rest after ``done`` over
    ``world`` ranks took the first ``taken[r]`` places of its share."""
    rest = done.rest(n)
    is_done = torch.zeros(n - done.prefix, dtype=torch.bool)
    if done.beyond:
        is_done[torch.tensor(done.beyond) - done.prefix] = True
    for rank, count in taken.items():
        is_done[share(rest, world, rank)[:count] - done.prefix] = True
    open_places = (~is_done).nonzero().flatten()
    prefix = done.prefix + (int(open_places[0]) if len(open_places) else len(is_done))
    beyond = (is_done[prefix - done.prefix :].nonzero().flatten() + prefix).tolist()
    return Done(prefix, tuple(beyond))


@dataclass(frozen=True)
class Resumed:
    """What a resume did to one iterable's data, for the console and the run's record."""

    epoch: int
    old_world: int
    new_world: int
    done: int
    total: int

    def describe(self, name: str) -> str:
        left = self.total - self.done
        return (f"{name}: world {self.old_world} -> {self.new_world} at epoch {self.epoch}, "
                f"sample {self.done}/{self.total}: the remaining {left} samples split over "
                f"{self.new_world} rank(s)")


class EpochPosition:
    """An iterable's place in its epochs, saved with each checkpoint.

    ``epoch`` counts completed or abandoned passes; ``batch`` the batches handed out in
    the current pass; ``taken`` this rank's samples among them (padding not counted);
    ``done`` and ``world`` describe the split the pass runs on.
    """

    def __init__(self, rank: int, world: int):
        self.rank = rank
        self.world = world
        self.epoch = 0
        self.batch = 0
        self.taken = 0
        self.done = Done()
        self.size: int | None = None  # the dataset's length, once a pass has begun
        self._share = 0  # this rank's share of the pass's rest (padding not counted)
        self._resume_pending = False
        self._in_pass = False

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "batch": self.batch, "taken": self.taken,
                "prefix": self.done.prefix, "beyond": list(self.done.beyond),
                "world": self.world, "size": self.size}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Goes on from this rank's own saved state (the same world size)."""
        self.epoch, self.batch = int(state["epoch"]), int(state["batch"])
        self.taken = int(state.get("taken", 0))
        self.done = Done(int(state.get("prefix", 0)), tuple(state.get("beyond", ())))
        self.size = state.get("size")
        self._resume_pending = self.batch > 0 or self.done.count() > 0

    def restore(self, states: Mapping[int, Mapping[str, Any]]) -> Resumed | None:
        """Resumes from every rank's saved state (``states`` by rank, all of one
        checkpoint). The same world size: this rank's own. Another: the ranks' shares
        merged and the rest of the epoch split anew; returns what happened then."""
        if not states:
            return None
        old_world = len(states)
        if old_world == self.world and self.rank in states:
            self.load_state_dict(states[self.rank])
            return None
        first = states[min(states)]
        epoch = int(first["epoch"])
        if "prefix" not in first or first.get("size") is None:  # written before positions
            self.load_state_dict({"epoch": epoch, "batch": 0})
            return Resumed(epoch, old_world, self.world, 0, int(first.get("size") or 0))
        size = int(first["size"])
        base = Done(int(first["prefix"]), tuple(first["beyond"]))
        split = {r: int(s["taken"]) for r, s in states.items()
                 if int(s["epoch"]) == epoch and int(s["prefix"]) == base.prefix}
        done = merge(base, size, int(first["world"]), split)
        self.epoch, self.batch, self.taken, self.done, self.size = epoch, 0, 0, done, size
        self._resume_pending = done.count() > 0
        return Resumed(epoch, old_world, self.world, done.count(), size)

    def set_epoch(self, epoch: int) -> None:
        """The training loop's epoch (``sampler.set_epoch``): another than this one's
        starts that epoch from its beginning; the same keeps a resumed position."""
        if epoch != self.epoch:
            self.epoch, self.batch, self.taken, self.done = epoch, 0, 0, Done()
            self._resume_pending = self._in_pass = False

    def begin_pass(self) -> None:
        """Starts a pass: a new epoch unless a resumed one is pending; one abandoned
        mid-way counts as done."""
        if self._in_pass and not self._resume_pending:
            self.epoch += 1  # the previous pass was abandoned: this is a new epoch
        if not self._resume_pending:
            self.batch, self.taken, self.done = 0, 0, Done()
        self._resume_pending = False
        self._in_pass = True

    def batches(self, n: int, batch_size: int, drop_last: bool = False,
                even: bool = False) -> list[torch.Tensor]:
        """This rank's batches (places of the epoch's order) still to run in this pass."""
        self.size = n
        batches = plan(self.done, n, self.world, self.rank, batch_size, drop_last, even)
        self._share = len(share(self.done.rest(n), self.world, self.rank))
        return batches[self.batch :]

    def took(self, places: torch.Tensor) -> None:
        """Notes a batch handed to the training loop. A rank's own samples come before
        any padding in its plan, so what it took of its share is capped by the share."""
        self.batch += 1
        self.taken = min(self.taken + len(places), self._share)

    def end_pass(self) -> None:
        self.epoch += 1
        self.batch, self.taken, self.done = 0, 0, Done()
        self._in_pass = False


class Resumable(Protocol):
    """What the session saves with each checkpoint and restores at each start: dataset
    shards and prepared data loaders."""

    def state_dict(self) -> dict[str, Any]: ...

    def restore(self, states: Mapping[int, Mapping[str, Any]]) -> Resumed | None: ...


def ranks_states(worker_states: Mapping[str, Mapping[str, Any]], key: str
                 ) -> dict[int, Mapping[str, Any]]:
    """Each rank's saved state of the iterable ``key``, by rank."""
    return {int(rank): states[key] for rank, states in worker_states.items()
            if key in states}
