"""elastic-train's rendezvous backends, added to torch's handler registry by ``register()``.

``register()`` makes ``--rdzv-backend etcd-v3`` build torch's own
``DynamicRendezvousHandler`` over etcd's v3 API (see :mod:`.etcd_v3`), and points
``etcd`` at the same thing: torch's handlers of that name speak the v2 API only,
which etcd 3.6 removed. Importing this package registers nothing, and ``etcd3gw``
(an optional dependency) is imported only when such a handler is created.

torch loads this package as its ``torchrun.handlers`` entry point while it imports
its own rendezvous package, possibly half way through importing its agent (e.g.
for ``torch.distributed.checkpoint``), so nothing of torch is imported here at
module level: each function imports what it uses.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed.elastic.rendezvous import (
        RendezvousHandler,
        RendezvousInfo,
        RendezvousParameters,
    )

    from elastic_train.agent.rendezvous.etcd_v3 import EtcdV3RendezvousBackend

logger = logging.getLogger(__name__)

_LEFT_KEY = "elastic_train/nodes_left"


def create_etcd_v3_handler(params: RendezvousParameters) -> RendezvousHandler:
    """torch's DynamicRendezvousHandler over an etcd v3 backend and store.

    torch never tells a backend that its handler shut down, so the handler's
    ``shutdown`` is wrapped to also stop the backend's lease refresh afterwards,
    and to delete the run's keys once the job is over: each node of the last
    round counts itself out in that round's store after closing the rendezvous,
    and the node that completes the count deletes every key of the run. A job
    that ends otherwise (a node killed, a failure) leaves its keys to the lease,
    which expires ``lease_ttl`` seconds after the last node stopped.
    """
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

    from elastic_train.agent.rendezvous.etcd_v3 import create_backend

    backend, store = create_backend(params)
    handler = create_handler(store, backend, params)
    next_rendezvous, shutdown = handler.next_rendezvous, handler.shutdown
    last_round: list[RendezvousInfo] = []

    def next_rendezvous_noted() -> RendezvousInfo:
        info = next_rendezvous()
        last_round[:] = [info]
        return info

    def shutdown_and_close() -> bool:
        try:
            closed = shutdown()
            if closed and last_round:
                _leave(last_round[0], backend)
            return closed
        finally:
            backend.close()

    handler.next_rendezvous = next_rendezvous_noted  # type: ignore[method-assign]
    handler.shutdown = shutdown_and_close  # type: ignore[method-assign]
    return handler


def _leave(last_round: RendezvousInfo, backend: EtcdV3RendezvousBackend) -> None:
    """Counts this node out of its last round; the last one out deletes the run's keys."""
    from torch.distributed import DistStoreError
    from torch.distributed.elastic.rendezvous import RendezvousError

    try:
        if last_round.store.add(_LEFT_KEY, 1) >= last_round.world_size:
            backend.delete_keys()
    except (RendezvousError, DistStoreError) as exc:  # the lease deletes them later
        logger.warning("Could not delete the run's etcd keys (%s); they expire with "
                       "their lease.", exc)


def torchrun_handler() -> Callable[[RendezvousParameters], RendezvousHandler]:
    """The ``torchrun.handlers`` entry point (``pyproject.toml``): plain ``torchrun
    --rdzv-backend etcd-v3`` then uses this backend too, once the package is installed."""
    return create_etcd_v3_handler


def create_etcd_native_handler(params: RendezvousParameters) -> RendezvousHandler:
    """Our own etcd v3 handler (:mod:`.etcd_native`): per-node keys, leases and watches."""
    from elastic_train.agent.rendezvous.etcd_native import create_handler

    return create_handler(params)


HANDLERS: dict[str, Callable[[RendezvousParameters], RendezvousHandler]] = {
    "etcd-v3": create_etcd_v3_handler,
    "etcd": create_etcd_native_handler,
}


def register() -> None:
    """Registers :data:`HANDLERS` in torch's registry by name; idempotent.

    torch's registry refuses to re-register a taken name, and torch registers its
    v2 "etcd" handler on import, so a name held by another creator is dropped first.
    """
    from torch.distributed.elastic.rendezvous.registry import handler_registry

    for name, creator in HANDLERS.items():
        if handler_registry._registry.get(name) is not creator:
            handler_registry._registry.pop(name, None)
        handler_registry.register(name, creator)
