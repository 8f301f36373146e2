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
                          ) -> tuple[tuple[bool, ...], list[list[float]]]:
        """Each flag OR-ed over the ranks, and every rank's ``numbers`` (each >= 0): one
        list per number, by rank. All in the same one all_reduce: each rank writes its
        numbers into its own slots, zeros elsewhere, so the MAX of the slots is every
        rank's numbers. Built and read as tensors: a Python list of the slots of a
        thousand ranks would cost more than the collective."""
        if self.world_size == 1:
            return flags, [[n] for n in numbers]
        width, mine = len(numbers), torch.tensor([*flags, *numbers], dtype=torch.float64)
        tensor = mine
        if width:
            tensor = mine.new_zeros(len(flags) + self.world_size * width)
            tensor[:len(flags)] = mine[:len(flags)]
            start = len(flags) + dist.get_rank(self.group) * width
            tensor[start:start + width] = mine[len(flags):]
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.group)
        columns = tensor[len(flags):].view(self.world_size, width).t().tolist()
        return tuple(bool(v) for v in tensor[:len(flags)].tolist()), columns

    def barrier(self) -> None:
        """Returns once every rank has called it."""
        if self.world_size > 1:
            dist.barrier(group=self.group)

    def broadcast(self, obj: T, src: int = 0) -> T:
        """Rank ``src``'s ``obj`` on every rank."""
        if self.world_size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=src, group=self.group)
        return box[0]
