"""The state this process holds for live recovery, kept across in-process restarts.

A :class:`Held` is what a :class:`elastic_train.torch.LiveState` leaves behind when its
attempt fails: the training state of its last completed step, the number of steps done,
the session's data positions and report count at that step, and when it was taken.

While the attempt runs, the large part of the state is not copied: a model's parameters
and an optimizer's state are read from the objects themselves (its :class:`Keeper`),
which only the optimizer's step changes -- and an abort from another rank's failure is
held back from the optimizer's step to ``step_done()`` (:func:`~elastic_train.worker.
inprocess.loop.hold_aborts`), so the objects are always at a completed step when the
attempt ends. What changes elsewhere (a model's buffers, an optimizer's learning rate, a
scheduler, plain values) is copied at each ``step_done()``, into the previous copy's
buffers. When the attempt fails, :func:`freeze_all` reads the whole state from the
keepers (onto the host, so that a GPU's memory is free before the next attempt
allocates) and lets the objects go. A rank whose own error came inside a step (``open``)
holds nothing: its objects may be half-way through an update.

Example::

    entry = Held(keepers={"model": keeper})   # by LiveState, at its first step_done()
    keep("default", entry)
    freeze_all()                              # the attempt failed
    assert get("default").frozen is not None
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

logger = logging.getLogger(__name__)
_HELD: dict[str, Held] = {}  # by LiveState name: what this process holds


class Keeper(Protocol):
    """Reads one kept object's state: its cheap part at each step, the whole at the end."""

    def copy(self) -> None:
        """At ``step_done()``: copies what can change outside the optimizer's step."""

    def full_state(self) -> Any:
        """The object's whole state at the last copy (its ``state_dict()`` form)."""


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


def map_leaves(tree: Any, fn: Any, leaf: type | tuple[type, ...] = torch.Tensor) -> Any:
    """``tree`` (dicts, lists, tuples) with ``fn`` applied to each ``leaf``-typed value."""
    if isinstance(tree, leaf):
        return fn(tree)
    if isinstance(tree, Mapping):
        return {key: map_leaves(value, fn, leaf) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(map_leaves(value, fn, leaf) for value in tree)
    return tree


def on_host(tree: Any) -> Any:
    """``tree`` with every tensor on the CPU (a GPU tensor copied; a CPU one as it is)."""
    return map_leaves(tree, lambda t: t.detach().cpu())


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
    """The bytes of every tensor in ``tree``."""
    return sum(t.numel() * t.element_size() for t in tensors(tree))


@dataclass
class Held:
    """One LiveState's state in this process (see the module's docstring).

    Attributes:
        keepers: The live objects' keepers, by key, while the attempt runs.
        step: Steps done at the last ``step_done()`` (run-wide).
        positions: The session's data positions then, by key, as this rank saves them
            (:func:`~elastic_train.worker.data_position.every_rank` gives the others').
        iteration: The session's report count then.
        world: The world size then.
        taken_at: When (seconds since the epoch), for the goodput ledger.
        open: Inside a step: the optimizer stepped, ``step_done()`` not yet called.
        frozen: The whole state, by key, once the attempt ended (on the host).
    """

    keepers: dict[str, Keeper] = field(default_factory=dict)
    step: int = 0
    positions: dict[str, Any] = field(default_factory=dict)
    iteration: int = 0
    world: int = 1
    taken_at: float = 0.0
    open: bool = False
    frozen: dict[str, Any] | None = None

    def freeze(self) -> bool:
        """Reads the whole state from the keepers and lets the objects go; False (and
        nothing kept) when the attempt ended inside a step."""
        if self.frozen is None and not self.open:
            self.frozen = {key: on_host(keeper.full_state())
                           for key, keeper in self.keepers.items()}
        self.keepers = {}
        return self.frozen is not None


def get(name: str) -> Held | None:
    """What this process holds under ``name`` once its attempt ended (None: nothing)."""
    held = _HELD.get(name)
    return held if held is not None and held.frozen is not None else None


def keep(name: str, held: Held) -> None:
    _HELD[name] = held


def current(name: str) -> Held | None:
    """What is kept under ``name``, the running attempt's or a frozen one."""
    return _HELD.get(name)


def freeze_all() -> None:
    """An attempt ended: every LiveState's state is read and held, or dropped when the
    attempt ended inside one of its steps (see :meth:`Held.freeze`) or cannot be read (a
    device that failed: the rank is replaced, and another holds the state)."""
    for name, held in list(_HELD.items()):
        try:
            kept = held.freeze()
        except Exception:  # noqa: BLE001 -- a state that cannot be read is not held
            logger.warning("Live recovery: this rank's state %r cannot be read after the "
                           "failure; another rank's copy is used", name, exc_info=True)
            kept = False
        if not kept:
            del _HELD[name]
