"""A node's own etcd lease: its rendezvous keys live exactly as long as the node does."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from torch.distributed.elastic.rendezvous import RendezvousConnectionError

from elastic_train.agent.rendezvous.etcd_kv import EtcdKV

log = logging.getLogger(__name__)


class NodeLease:
    """Grants a lease of ``ttl`` seconds and refreshes it every ``interval`` seconds from a
    daemon thread, until :meth:`stop`.

    A node whose refreshes stopped for ``ttl`` seconds (it died, or was starved or
    cut off that long) loses the lease, and with it every key written with it; etcd
    deletes them, which is how the other nodes learn of it -- no heartbeat is ever
    rewritten into shared state. Should that happen to a live node, a new lease is
    granted and :attr:`renewals` counts up, telling the node to write its keys again.

    ``also`` is called every ``also_every`` seconds from the same thread (the run's
    shared lease is refreshed so, one thread per node being enough).
    """

    def __init__(self, kv: EtcdKV, ttl: int, interval: float, name: str,
                 also: Callable[[], None] | None = None, also_every: float = 0.0) -> None:
        self._kv = kv
        self.ttl = ttl
        self.id, _ = kv.grant(ttl)
        self.renewals = 0
        self._also, self._also_every = also, also_every
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._keep_alive, args=(interval,),
                                        name=f"etcd-node-lease-{name}", daemon=True)
        self._thread.start()

    def _keep_alive(self, interval: float) -> None:
        also_at = time.monotonic() + self._also_every
        while not self._stopped.wait(interval):
            if self._also is not None and time.monotonic() >= also_at:
                self._also()
                also_at = time.monotonic() + self._also_every
            try:
                if self._kv.keep_alive(self.id) <= 0:
                    self.renew(self.id)
            except RendezvousConnectionError as exc:
                log.warning("Refreshing this node's etcd lease failed: %s", exc)

    def renew(self, expired: int) -> None:
        """Grants a new lease in place of ``expired`` (unless another thread already did)."""
        with self._lock:
            if self.id != expired:
                return
            log.warning("This node's etcd lease expired (no refresh for %d s); its rendezvous "
                        "keys were deleted and are written again.", self.ttl)
            self.id, _ = self._kv.grant(self.ttl)
            self.renewals += 1

    def stop(self, revoke: bool) -> None:
        """Stops the refreshes (idempotent); ``revoke`` also deletes the node's keys now."""
        self._stopped.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        if revoke:
            try:
                self._kv.revoke(self.id)
            except RendezvousConnectionError as exc:  # the keys expire with the lease
                log.warning("Could not revoke this node's etcd lease: %s", exc)
