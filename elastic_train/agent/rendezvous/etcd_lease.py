"""A node's own etcd lease: its rendezvous keys live exactly as long as the node does."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor

from torch.distributed.elastic.rendezvous import RendezvousConnectionError

from elastic_train.agent.rendezvous.etcd_kv import EtcdKV

log = logging.getLogger(__name__)


class NodeLease:
    """Grants a lease of ``ttl`` seconds, refreshed every ``interval`` seconds until :meth:`stop`
    (with ``refreshes_per_ttl``: that many times in the TTL etcd granted, which may be
    longer than ``ttl``: etcd's minimum).

    A node whose refreshes stopped for ``ttl`` seconds (it died, or was starved or
    cut off that long) loses the lease, and with it every key written with it; etcd
    deletes them, which is how the other nodes learn of it -- no heartbeat is ever
    rewritten into shared state. Should that happen to a live node, :meth:`renew`
    grants a new lease and :attr:`renewals` counts up, telling the node to write its
    keys again. ``also`` is called every ``also_every`` seconds along with the
    refreshes (the run's shared lease is refreshed so); nodes of one process that
    name the same ``also_key`` share that call.

    The refreshes are sent by the process's :class:`_Refresher`, started with the
    first lease: a node has one lease, and a process simulating many nodes refreshes
    theirs together instead of paying a thread and a request per node.
    """

    def __init__(self, kv: EtcdKV, ttl: int, interval: float, name: str,
                 also: Callable[[], None] | None = None, also_every: float = 0.0,
                 also_key: Hashable = None, refreshes_per_ttl: int | None = None) -> None:
        self._kv = kv
        self.ttl = ttl
        self.name = name
        self.id, granted = kv.grant(ttl)
        self.interval = granted / refreshes_per_ttl if refreshes_per_ttl else interval
        self.renewals = 0
        self._also, self._also_every, self._also_key = also, also_every, also_key
        self._also_at = time.monotonic() + also_every
        self._lock = threading.Lock()
        _REFRESHER.add(self)

    def also_if_due(self, done: set[Hashable]) -> None:
        """Calls ``also`` if due, unless a node with the same ``also_key`` did in ``done``."""
        if self._also is not None and time.monotonic() >= self._also_at:
            if self._also_key is None or self._also_key not in done:
                self._also()
                done.add(self._also_key)
            self._also_at = time.monotonic() + self._also_every

    def renew(self, expired: int) -> None:
        """Grants a new lease in place of ``expired`` (unless another thread already did)."""
        with self._lock:
            if self.id != expired:
                return
            log.warning("The etcd lease of node %s expired (no refresh for %d s); its rendezvous "
                        "keys were deleted and are written again.", self.name, self.ttl)
            self.id, _ = self._kv.grant(self.ttl)
            self.renewals += 1

    def stop(self, revoke: bool) -> None:
        """Stops the refreshes (idempotent); ``revoke`` also deletes the node's keys now."""
        _REFRESHER.remove(self)
        if revoke:
            try:
                self._kv.revoke(self.id)
            except RendezvousConnectionError as exc:  # the keys expire with the lease
                log.warning("Could not revoke the etcd lease of node %s: %s", self.name, exc)


class _Refresher:
    """The process's lease refresher: a daemon thread, started with the first lease, that
    every ``interval`` refreshes the leases due, those on one etcd endpoint in one
    call (see :meth:`EtcdKV.keep_alive`), from a small pool of threads. A lease whose
    last refresh is still under way is skipped, never queued twice."""

    WORKERS = 4
    BATCH = 256

    def __init__(self) -> None:
        self._due: dict[NodeLease, float] = {}
        self._busy: set[NodeLease] = set()
        self._changed = threading.Condition()
        self._pool: ThreadPoolExecutor | None = None

    def add(self, lease: NodeLease) -> None:
        with self._changed:
            self._due[lease] = time.monotonic() + lease.interval
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.WORKERS, "etcd-lease-refresh")
                threading.Thread(target=self._run, name="etcd-lease-refresher",
                                 daemon=True).start()
            self._changed.notify()

    def remove(self, lease: NodeLease) -> None:
        with self._changed:
            self._due.pop(lease, None)

    def _run(self) -> None:
        while True:
            with self._changed:
                now = time.monotonic()
                # Leases due within the next tick go now, so that one sweep serves many.
                tick = min((lease.interval for lease in self._due), default=1.0) / 4
                due = [lease for lease, at in self._due.items()
                       if at <= now + tick and lease not in self._busy]
                for lease in due:
                    self._due[lease] = now + lease.interval
                    self._busy.add(lease)
                if not due:
                    soonest = min(self._due.values(), default=now + 3600.0)
                    self._changed.wait(max(soonest - now, tick))
                    continue
            assert self._pool is not None
            by_endpoint: dict[str, list[NodeLease]] = {}
            for lease in due:
                by_endpoint.setdefault(lease._kv.client.base_url, []).append(lease)
            try:
                for group in by_endpoint.values():
                    for start in range(0, len(group), self.BATCH):
                        self._pool.submit(self._refresh, group[start:start + self.BATCH])
            except RuntimeError:  # the interpreter is exiting: its pools take no more work
                return

    def _refresh(self, leases: list[NodeLease]) -> None:
        try:
            done: set[Hashable] = set()
            for lease in leases:
                lease.also_if_due(done)
            ttls: dict[int, int] = {}
            for _ in range(3):  # leases the answer left out are asked again
                wanted = [lease.id for lease in leases if lease.id not in ttls]
                if not wanted:
                    break
                ttls.update(leases[0]._kv.keep_alive(wanted))
            for lease in leases:
                if ttls.get(lease.id, 1) <= 0:
                    lease.renew(lease.id)
        except RendezvousConnectionError as exc:
            log.warning("Refreshing %d etcd lease(s) failed: %s", len(leases), exc)
        finally:
            with self._changed:
                self._busy.difference_update(leases)


_REFRESHER = _Refresher()
