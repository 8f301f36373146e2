"""The session's collectives: small agreements between the ranks, over the control group.

The control group is a gloo process group beside the one the training uses
(or the same group when that is gloo), so that the session's few messages --
which checkpoint to resume from, who holds which checkpoint file, who got a
preemption notice, each rank's step time -- never queue behind the training's NCCL
work. With one worker each collective answers at once.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


class ControlGroup:
    """Collectives over ``group`` (None: the default group) of ``world_size`` ranks."""

    def __init__(self, world_size: int, group: Any = None):
        self.world_size = world_size
        self.group = group

    def all_gather(self, obj: T) -> list[T]:
        """Every rank's ``obj``, by rank."""
        if self.world_size == 1:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def any_rank(self, *flags: bool) -> tuple[bool, ...]:
        """Each flag OR-ed over the ranks: one all_reduce of a few numbers, the
        cheapest collective there is (an object gather is two, plus pickling)."""
        return self.any_rank_and_each(flags, ())[0]

    def any_rank_and_each(self, flags: tuple[bool, ...], numbers: tuple[float, ...]
                          ) -> tuple[tuple[bool, ...], list[tuple[float, ...]]]:
        """Each flag OR-ed over the ranks, and every rank's ``numbers`` (each >= 0), by
        rank, in the same one all_reduce: each rank writes its numbers into its own
        slots, zeros elsewhere, so the MAX of the slots is every rank's numbers."""
        if self.world_size == 1:
            return flags, [numbers]
        width = len(numbers)
        values = [*map(float, flags), *[0.0] * (self.world_size * width)]
        start = len(flags) + dist.get_rank(self.group) * width
        values[start:start + width] = numbers
        # built as a list: cheaper than writing into the slices of a tensor
        tensor = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.group)
        values = tensor.tolist()
        each = values[len(flags):]
        return (tuple(bool(v) for v in values[:len(flags)]),
                [tuple(each[r * width:(r + 1) * width]) for r in range(self.world_size)])

    def barrier(self) -> None:
        """Returns once every rank has called it."""
        if self.world_size > 1:
            dist.barrier(group=self.group)

    def broadcast(self, obj: T) -> T:
        """Rank 0's ``obj`` on every rank."""
        if self.world_size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]
