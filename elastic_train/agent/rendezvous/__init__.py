"""elastic-train's rendezvous backends, added to torch's handler registry by ``register()``.

``register()`` makes ``--rdzv-backend etcd-v3`` build torch's own
``DynamicRendezvousHandler`` over etcd's v3 API (see :mod:`.etcd_v3`), and points
``etcd`` at the same thing: torch's handlers of that name speak the v2 API only,
which etcd 3.6 removed. Importing this package registers nothing, and ``etcd3gw``
(an optional dependency) is imported only when such a handler is created.
"""

from __future__ import annotations

from collections.abc import Callable

from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler
from torch.distributed.elastic.rendezvous.registry import handler_registry

ETCD_V3_BACKENDS = ("etcd-v3", "etcd")


def create_etcd_v3_handler(params: RendezvousParameters) -> RendezvousHandler:
    """torch's DynamicRendezvousHandler over an etcd v3 backend and store.

    torch never tells a backend that its handler shut down, so the handler's
    ``shutdown`` is wrapped to also stop the backend's lease refresh afterwards.
    """
    from elastic_train.agent.rendezvous.etcd_v3 import create_backend

    backend, store = create_backend(params)
    handler = create_handler(store, backend, params)
    shutdown = handler.shutdown

    def shutdown_and_close() -> bool:
        try:
            return shutdown()
        finally:
            backend.close()

    handler.shutdown = shutdown_and_close  # type: ignore[method-assign]
    return handler


def torchrun_handler() -> Callable[[RendezvousParameters], RendezvousHandler]:
    """The ``torchrun.handlers`` entry point (``pyproject.toml``): plain ``torchrun
    --rdzv-backend etcd-v3`` then uses this backend too, once the package is installed."""
    return create_etcd_v3_handler


def register() -> None:
    """Registers :func:`create_etcd_v3_handler` as "etcd-v3" and "etcd"; idempotent.

    torch's registry refuses to re-register a taken name, and torch registers its
    v2 "etcd" handler on import, so a name held by another creator is dropped first.
    """
    for name in ETCD_V3_BACKENDS:
        if handler_registry._registry.get(name) is not create_etcd_v3_handler:
            handler_registry._registry.pop(name, None)
        handler_registry.register(name, create_etcd_v3_handler)
