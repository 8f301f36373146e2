"""The state this process holds for live recovery: a copy of the training state taken at
the last completed step, kept across in-process restarts.

A :class:`Held` is what :meth:`elastic_train.torch.LiveState.step_done` leaves behind: the
user's state (the ``state_dict()`` of each object it was given, plain values as they
were) copied into buffers of its own, the number of steps done, the session's data
positions and report count at that step, and when it was taken. The train function's
own objects die with a failed attempt (a garbage collection frees them); the copy lives
in this module, so a survivor's next attempt still has it.

Copies are taken on the tensor's own device, into the previous copy's buffers when
their shapes still fit (no allocation after the first step). A copy that did not finish
(an error inside a ``state_dict()``) is never held: the previous one is dropped first,
so a survivor holds either a whole step or nothing.

Example::

    keep("default", Held.take(7, state, positions={}, iteration=3, world=2,
                              previous=drop("default")))
    assert get("default").step == 7
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

_HELD: dict[str, Held] = {}  # by LiveState name: what this process holds


def copy_tree(tree: Any, into: Any = None) -> Any:
    """``tree`` (dicts, lists, tuples, tensors, plain values) with every tensor copied,
    into ``into``'s tensor at the same place where its shape, dtype and device match."""
    if isinstance(tree, torch.Tensor):
        source = tree.detach()
        if (isinstance(into, torch.Tensor) and into.shape == source.shape
                and into.dtype == source.dtype and into.device == source.device):
            return into.copy_(source)
        return source.clone()
    if isinstance(tree, Mapping):
        old = into if isinstance(into, Mapping) else {}
        return {key: copy_tree(value, old.get(key)) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        old = into if isinstance(into, (list, tuple)) and len(into) == len(tree) else ()
        copied = [copy_tree(value, old[i] if old else None) for i, value in enumerate(tree)]
        return copied if isinstance(tree, list) else tuple(copied)
    return tree


def tensors(tree: Any) -> Iterator[torch.Tensor]:
    """Every tensor of ``tree``, in a fixed order (keys in insertion order)."""
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, Mapping):
        for value in tree.values():
            yield from tensors(value)
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            yield from tensors(value)


def nbytes(tree: Any) -> int:
    """The bytes of every tensor in ``tree``: what a held copy costs in memory."""
    return sum(t.numel() * t.element_size() for t in tensors(tree))


@dataclass
class Held:
    """One completed step's state, held in this process (see the module's docstring).

    Attributes:
        step: Steps done when it was taken (``LiveState.step_done`` calls, run-wide).
        state: The user's state: each object's ``state_dict()``, plain values as given.
        positions: The session's data positions at that step, by key, as the rank that
            took it saves them (:func:`~elastic_train.worker.data_position.every_rank`
            gives every other rank's).
        iteration: The session's report count at that step.
        world: The world size it was taken at.
        taken_at: When (seconds since the epoch), for the goodput ledger.
    """

    step: int
    state: dict[str, Any]
    positions: dict[str, Any] = field(default_factory=dict)
    iteration: int = 0
    world: int = 1
    taken_at: float = 0.0

    @classmethod
    def take(cls, step: int, state: dict[str, Any], positions: dict[str, Any],
             iteration: int, world: int, previous: Held | None) -> Held:
        """A copy of ``state`` at ``step``, into ``previous``'s buffers where they fit."""
        return cls(step, copy_tree(state, previous.state if previous else None),
                   positions, iteration, world, time.time())


def get(name: str) -> Held | None:
    """What this process holds under ``name`` (None: nothing)."""
    return _HELD.get(name)


def keep(name: str, held: Held) -> None:
    _HELD[name] = held


def drop(name: str) -> Held | None:
    """Forgets what is held under ``name`` (a copy is about to be taken, or replaced);
    returns it, so that its buffers can be reused."""
    return _HELD.pop(name, None)
