"""The session's collectives: small agreements between the ranks, over the control group.

The control group is a gloo process group beside the one the training uses
(or the same group when that is gloo), so that the session's few messages --
which checkpoint to resume from, who holds which checkpoint file, who got a
preemption notice -- never queue behind the training's NCCL work. With one
worker each collective answers at once.
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
        """Each flag OR-ed over the ranks: one all_reduce of a few integers, the
        cheapest collective there is (an object gather is two, plus pickling)."""
        if self.world_size == 1:
            return flags
        tensor = torch.tensor(flags, dtype=torch.int32)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.group)
        return tuple(bool(v) for v in tensor.tolist())

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
