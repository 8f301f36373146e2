"""torch's dynamic rendezvous over etcd's v3 API: the handler our ``etcd-v3`` backend creates.

:func:`create_etcd_v3_handler` is what :mod:`.registry` registers under
``etcd-v3`` and ``etcd`` (torch's own handlers of that name speak the v2 API
only, which etcd 3.6 removed), and what the package's ``torchrun.handlers``
entry point hands plain ``torchrun``. ``etcd3gw`` (an optional dependency) is
imported only when a handler is created.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from torch.distributed import DistStoreError
from torch.distributed.elastic.rendezvous import (
    RendezvousError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
)

from elastic_train.agent.rendezvous.torch_state import checked_handler

if TYPE_CHECKING:
    from elastic_train.agent.rendezvous.etcd_v3 import EtcdV3RendezvousBackend

logger = logging.getLogger(__name__)

_LEFT_KEY = "elastic_train/nodes_left"


def create_etcd_v3_handler(params: RendezvousParameters) -> RendezvousHandler:
    """torch's DynamicRendezvousHandler over an etcd v3 backend and store.

    torch never tells a backend that its handler shut down, so the handler's
    ``shutdown`` is wrapped to also stop the backend's lease refresh afterwards
    (``release()``, which the agent calls however it ends, stops it without closing),
    and to delete the run's keys once the job is over: each node of the last
    round counts itself out in that round's store after closing the rendezvous,
    and the node that completes the count deletes every key of the run. A job
    that ends otherwise (a node killed, a failure) leaves its keys to the lease,
    which expires ``lease_ttl`` seconds after the last node stopped. torch's handler
    unpickles the state it reads: it reads it through :func:`~.torch_state.checked_handler`.
    """
    from elastic_train.agent.rendezvous.etcd_v3 import create_backend

    backend, store = create_backend(params)
    where = f"etcd key {backend.state_key.decode(errors='replace')}"
    handler = checked_handler(store, backend, where, params)
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

    def release() -> None:
        """Stops this node's heartbeats and lease refresh, leaving the rendezvous open
        (the agent failed or was interrupted: the other nodes may go on without it)."""
        # imported here: torch loads this module while its agent module is half imported
        # (the registry's out-of-tree handlers), and torch_compat imports from that module
        from elastic_train.agent import torch_compat

        torch_compat.stop_keep_alive(handler)
        backend.close()

    handler.next_rendezvous = next_rendezvous_noted  # type: ignore[method-assign]
    handler.shutdown = shutdown_and_close  # type: ignore[method-assign]
    handler.release = release  # type: ignore[attr-defined]
    return handler


def _leave(last_round: RendezvousInfo, backend: EtcdV3RendezvousBackend) -> None:
    """Counts this node out of its last round; the last one out deletes the run's keys."""
    try:
        if last_round.store.add(_LEFT_KEY, 1) >= last_round.world_size:
            backend.delete_keys()
    except (RendezvousError, DistStoreError) as exc:  # the lease deletes them later
        logger.warning("Could not delete the run's etcd keys (%s); they expire with "
                       "their lease.", exc)

