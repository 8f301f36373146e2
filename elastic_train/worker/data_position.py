"""Where an epoch's data stands, whatever the world size.

A position is a fact about the epoch, not about a rank: which places of the epoch's
seeded global order are done (:class:`Done`). Each pass takes the places not yet done
in optimizer steps of ``W * accumulation * batch_size`` places; rank ``r`` of ``W``
takes every ``W``-th place of a step from its ``r``-th, in ``accumulation``
micro-batches (:func:`plan`), and every rank runs the same number of batches. A
checkpoint keeps each rank's :class:`EpochPosition` (the epoch, what was done when the
pass split, the world it split over, and what the rank has taken since). A resume at the
same world size goes on with each rank's own plan where it stopped, so it stays
bit-identical; at another, the ranks' shares are merged back into one :class:`Done`
(:func:`merge`) and the rest of the epoch is split over the new ranks. Every sample is
then trained on once per epoch, whatever sequence of shrinks and grows happens, and a
resume seeks by index: nothing it skips is read again. With a global batch
(:func:`accumulation_for`), step ``k`` after a resume at a step's end holds the same
samples at any world size, so the optimizer sees the same global batches.

Where the last step of a pass has fewer places than it holds (the tail of an epoch):

- by default (exactly once) ranks take one sample fewer or more, so a rank's last batch
  can be smaller than the others';
- ``drop_last`` drops the places that do not fill a step (torch's ``drop_last``: up to
  ``W * batch_size - 1`` samples skipped per pass without accumulation);
- ``even`` (torch ``DistributedSampler``'s padding) gives every rank as many samples by
  repeating one on the ranks short of one.

A rank left without any sample for a batch (fewer samples left than ranks) repeats one:
padding, as torch's. Padding is never counted as done, and its :meth:`Batch.loss_scale`
is 0, so a loop that scales its loss by it trains on every sample exactly once.

Example::

    position = EpochPosition(rank=0, world=2)
    position.begin_pass()
    for batch in position.batches(n=10, batch_size=2):
        position.took(batch)   # after batch.places was handed to the training loop
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import torch

from elastic_train.errors import ConfigError


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


class Batch(NamedTuple):
    """One batch of a rank's plan: ``places`` in the epoch's order, of which the first
    ``real`` are the rank's own (the rest repeat one: padding), in an optimizer step of
    ``step_samples`` samples over all ranks, whose last micro-batch it is if ``ends_step``."""

    places: torch.Tensor
    real: int
    step_samples: int
    ends_step: bool

    def loss_scale(self, world: int) -> float:
        """The factor that makes the mean losses of the step's micro-batches, averaged over
        ranks (DDP) and summed over micro-batches, the mean over the step's samples; 0 for
        a batch of padding."""
        return world * self.real / self.step_samples if self.real else 0.0


def steps_of(remaining: int, step_size: int, drop_last: bool) -> int:
    """How many optimizer steps of ``step_size`` samples go through ``remaining``."""
    return remaining // step_size if drop_last else math.ceil(remaining / step_size)


def plan(done: Done, n: int, world: int, rank: int, batch_size: int,
         drop_last: bool = False, even: bool = False, accumulation: int = 1) -> list[Batch]:
    """Rank ``rank``'s batches for the rest of an epoch of ``n`` after ``done``, split
    over ``world`` ranks in optimizer steps of ``world * accumulation * batch_size``
    places: step ``k`` takes the next such run of the rest, and rank ``r`` its every
    ``world``-th place from its ``r``-th, in ``accumulation`` micro-batches. Every rank
    gets as many batches; see the module's docstring for the tail."""
    rest = done.rest(n)
    step_size = world * accumulation * batch_size
    batches = []
    for step in range(steps_of(len(rest), step_size, drop_last)):
        places = rest[step * step_size : (step + 1) * step_size]
        mine = share(places, world, rank)
        real = len(mine)
        if even and real < math.ceil(len(places) / world):
            mine = torch.cat([mine, rest[:1]])  # torch's padding: a repeat of the rest's first
        for micro in range(accumulation):
            part = mine[micro * batch_size : (micro + 1) * batch_size]
            own = min(max(real - micro * batch_size, 0), len(part))
            if not len(part):  # none of this rank's samples left for this batch: padding
                part = rest[:1]
            batches.append(Batch(part, own, len(places), micro == accumulation - 1))
    return batches


def check_global_batch(global_batch_size: int, worlds: Sequence[int]) -> None:
    """A ConfigError unless ``global_batch_size`` divides by each of ``worlds`` (every
    world size the job may run at: checked at the first, not when a node joins)."""
    bad = [world for world in worlds if global_batch_size % world]
    if bad:
        sizes = ", ".join(map(str, sorted(set(worlds))))
        raise ConfigError(
            f"prepare_data_loader(global_batch_size={global_batch_size}) cannot be split over "
            f"{bad[0]} workers (this job may run at {sizes}): use a multiple of every world "
            f"size the job may run at (e.g. {math.lcm(global_batch_size, *worlds)}), or "
            "leave it out to let the global batch follow the world size.")


def accumulation_for(global_batch_size: int, world: int, batch_size: int) -> tuple[int, int]:
    """(micro-batches per optimizer step, micro-batch size) that keep a step at
    ``global_batch_size`` samples on ``world`` ranks, with micro-batches of at most
    ``batch_size`` (fewer, smaller ones where it does not divide)."""
    check_global_batch(global_batch_size, [world])
    per_rank = global_batch_size // world
    steps = math.ceil(per_rank / batch_size)
    while per_rank % steps:
        steps += 1
    return steps, per_rank // steps


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
    global_batch: int | None = None  # samples per optimizer step, where kept
    accumulation: int = 1  # micro-batches per optimizer step on each rank

    def describe(self, name: str) -> str:
        left = self.total - self.done
        said = (f"{name}: world {self.old_world} -> {self.new_world} at epoch {self.epoch}, "
                f"sample {self.done}/{self.total}: the remaining {left} samples split over "
                f"{self.new_world} rank(s)")
        if self.global_batch:
            said += (f"; global batch {self.global_batch} kept by {self.accumulation} "
                     "accumulation step(s)")
        return said


class EpochPosition:
    """An iterable's place in its epochs, saved with each checkpoint.

    ``epoch`` counts completed or abandoned passes; ``batch`` the batches handed out in
    the current pass; ``taken`` this rank's samples among them (padding not counted);
    ``done`` and ``world`` describe the split the pass runs on. ``finished``: every batch
    of the pass was handed out, whether or not its iterator was then asked for its end
    (``zip(a, b)`` stops at the shorter one): the pass is done, and a resume from it
    goes on with the next epoch.
    """

    def __init__(self, rank: int, world: int):
        self.rank = rank
        self.world = world
        self.epoch = 0
        self.batch = 0
        self.taken = 0
        self.done = Done()
        self.size: int | None = None  # the dataset's length, once a pass has begun
        self.finished = False
        self._pass_length: int | None = None  # batches of the pass's whole plan
        self._plan: list[Any] | None = None  # the pass's plan() arguments past the rank's
        self._resume_pending = False
        self._in_pass = False

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "batch": self.batch, "taken": self.taken,
                "prefix": self.done.prefix, "beyond": list(self.done.beyond),
                "world": self.world, "size": self.size, "plan": self._plan,
                "finished": self.finished}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Goes on from this rank's own saved state (the same world size)."""
        self.epoch, self.batch = int(state["epoch"]), int(state["batch"])
        self.taken = int(state.get("taken", 0))
        self.done = Done(int(state.get("prefix", 0)), tuple(state.get("beyond", ())))
        self.size = state.get("size")
        self.finished = bool(state.get("finished", False))
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
        self.finished = bool(first.get("finished", False))
        self._resume_pending = done.count() > 0
        return Resumed(epoch, old_world, self.world, done.count(), size)

    def set_epoch(self, epoch: int) -> None:
        """The training loop's epoch (``sampler.set_epoch``): another than this one's
        starts that epoch from its beginning; the same keeps a resumed position, also a
        finished one (the loop says it is still in that epoch: its rest is empty)."""
        if epoch != self.epoch:
            self.epoch, self.batch, self.taken, self.done = epoch, 0, 0, Done()
            self._resume_pending = self._in_pass = False
        self.finished = False

    def begin_pass(self) -> None:
        """Starts a pass: a new epoch unless a resumed one is pending; one finished or
        abandoned mid-way counts as done."""
        if self.finished or (self._in_pass and not self._resume_pending):
            self.epoch += 1  # the previous pass was finished or abandoned: a new epoch
            self._resume_pending = False
        if not self._resume_pending:
            self.batch, self.taken, self.done = 0, 0, Done()
        self._resume_pending = self.finished = False
        self._in_pass = True

    def batches(self, n: int, batch_size: int, drop_last: bool = False, even: bool = False,
                accumulation: int = 1) -> list[Batch]:
        """This rank's batches (see :func:`plan`) still to run in this pass."""
        self.size = n
        self._plan = [batch_size, drop_last, even, accumulation]
        whole = plan(self.done, n, self.world, self.rank, batch_size, drop_last, even,
                     accumulation)
        self._pass_length = len(whole)
        return whole[self.batch :]

    def took(self, batch: Batch) -> None:
        """Notes a batch handed to the training loop (its padding is not the rank's); the
        pass's last one finishes the pass."""
        self.batch += 1
        self.taken += batch.real
        self.finished = self.batch == self._pass_length

    def end_pass(self) -> None:
        self.epoch += 1
        self.batch, self.taken, self.done = 0, 0, Done()
        self._in_pass = self.finished = False


def every_rank(state: Mapping[str, Any]) -> dict[int, dict[str, Any]]:
    """Every rank's state of a position, from one rank's ``state`` taken where every rank
    had handed out as many batches (after an optimizer step): the ranks of a split run
    the same plan in step, so they differ only in the samples each took."""
    world, args = int(state.get("world", 1)), state.get("plan")
    if args is None or state.get("size") is None:  # no pass planned yet: nothing taken
        return {rank: dict(state) for rank in range(world)}
    done = Done(int(state["prefix"]), tuple(state["beyond"]))
    return {rank: {**state, "taken": sum(b.real for b in plan(
                done, int(state["size"]), world, rank, *args)[: int(state["batch"])])}
            for rank in range(world)}


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
