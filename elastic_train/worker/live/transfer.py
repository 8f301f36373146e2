"""Which rank's held state the group goes on from, and its bytes to every other rank.

Collective, once per attempt, in :meth:`elastic_train.torch.LiveState.restore`:

1. Every rank says which step it holds (:func:`agree`; -1: nothing). The group goes on
   from the newest, held by the lowest rank holding it (the *source*). With DDP every
   rank's copy is the whole state, so a copy of one step is never mixed with another's;
   survivors that disagree (a rank died inside the step's last collective, so some
   finished the step and others did not) take the newest, which is a step that completed.
2. The source sends the state's layout (every tensor's shape and dtype, the plain
   values, the data positions and report count), then every tensor, over the session's
   control group (gloo; the held state is on the host, see :mod:`.held`), each into a
   buffer on the receiving rank's host (:func:`receive`); loading it puts it on the
   receiver's device. Nothing is read from storage.

When nobody holds a state (a fresh start, every process new), :func:`agree` says so and
the caller falls back to the latest checkpoint.

Example::

    source = agree(group, held.get("default"))
    if source is not None:
        state = receive(group, source, held.get("default"))
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from elastic_train.worker.control_group import ControlGroup
from elastic_train.worker.live.held import Held, map_leaves, tensors


class Source(NamedTuple):
    """The rank the group takes its state from, the step it holds, and the steps every
    rank held (-1: nothing), by rank."""

    rank: int
    step: int
    held: list[int]


@dataclass(frozen=True)
class _Slot:
    """A tensor's place in a sent layout: what the receiver allocates."""

    shape: tuple[int, ...]
    dtype: torch.dtype


def agree(group: ControlGroup, mine: Held | None) -> Source | None:
    """The source of this attempt's state (one small gather); None when no rank holds one."""
    held = group.all_gather(mine.step if mine is not None else -1)
    best = max(held)
    return Source(held.index(best), best, held) if best >= 0 else None


def _layout(tree: Any) -> Any:
    """``tree`` with each tensor replaced by the :class:`_Slot` a receiver fills."""
    return map_leaves(tree, lambda t: _Slot(tuple(t.shape), t.dtype))


def _filled(layout: Any) -> Any:
    """A tree of ``layout``'s shape with an empty host tensor in each slot."""
    return map_leaves(layout, lambda slot: torch.empty(slot.shape, dtype=slot.dtype), _Slot)


def receive(group: ControlGroup, source: Source, mine: Held | None) -> Held:
    """The source's held state on every rank (collective): the source's own there, a
    received copy elsewhere (``frozen`` holds the state)."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    sent = mine if rank == source.rank else None
    if group.world_size == 1:
        assert sent is not None
        return sent
    header = group.broadcast(
        replace(sent, keepers={}, frozen=_layout(sent.frozen)) if sent is not None else None,
        src=source.rank)
    state = sent.frozen if sent is not None else _filled(header.frozen)
    for tensor in tensors(state):
        dist.broadcast(tensor, src=source.rank, group=group.group)
    return replace(header, frozen=state)
