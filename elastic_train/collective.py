"""Collectives for the train function: ``ray.train.collective``'s two, on every rank.

Both run over the session's control group (a gloo group beside the training's,
:mod:`elastic_train.worker.control_group`), so they never queue behind NCCL work
and need nothing from the user's process group but that it exists.

Example::

    from elastic_train.collective import barrier, broadcast_from_rank_zero

    def train_func(config):
        plan = broadcast_from_rank_zero(
            {"seed": random.randrange(2**31)} if get_context().get_world_rank() == 0 else None)
        barrier()  # every rank has the plan

Where Ray's differ:

- Ray refuses data over 1 kB, because its rank 0 sends it through an actor.
  Here it goes over the gloo group, so any size works; large tensors are still
  faster through the training's own ``torch.distributed.broadcast``.
- Data rank 0 cannot pickle raises Ray's ``TypeError``/``PicklingError`` there,
  and there only: Ray's other ranks wait forever. Here every rank raises, the
  others a ``RuntimeError`` naming rank 0's error, so the attempt fails at once
  and restarts as any failure does.
"""

from __future__ import annotations

from typing import TypeVar

import cloudpickle

from elastic_train.worker.session import get_session

T = TypeVar("T")


def barrier() -> None:
    """Waits until every rank has called it (Ray's ``ray.train.collective.barrier``)."""
    get_session().join().group.barrier()


def broadcast_from_rank_zero(data: T) -> T:
    """Rank 0's ``data`` on every rank; the other ranks' ``data`` is ignored.

    Also a barrier: every rank must call it. As Ray's
    ``ray.train.collective.broadcast_from_rank_zero``, without its size limit
    (see the module's docstring).

    Example::

        name = broadcast_from_rank_zero(time.strftime("%H%M%S"))  # one name for all ranks
    """
    session = get_session()
    group = session.join().group
    if group.world_size == 1:
        cloudpickle.dumps(data)  # what cannot be sent fails alone too, as with many ranks
        return data
    payload: bytes | None = None
    error: str | None = None
    if session.env.rank == 0:
        try:
            payload = cloudpickle.dumps(data)
        except Exception as exc:  # noqa: BLE001 -- every rank learns it, then rank 0 re-raises
            error = f"{type(exc).__name__}: {exc}"
            group.broadcast((None, error))
            raise
    payload, error = group.broadcast((payload, error))
    if error is not None:
        raise RuntimeError(f"broadcast_from_rank_zero(): rank 0 could not pickle its data "
                           f"({error}).")
    return cloudpickle.loads(payload)
