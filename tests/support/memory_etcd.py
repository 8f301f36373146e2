"""An etcd v3 keyspace in memory, for running our native etcd handler without a server.

:class:`MemoryKV` answers the calls the handler makes on its
:class:`~elastic_train.agent.rendezvous.etcd_kv.EtcdKV` (transactions with the
gateway's operations and comparisons, nested ones included, leases, watches),
with etcd's revisions: one per transaction that changes something, the
comparisons of nested transactions decided before any operation runs, as etcd
does. A watch never blocks for long: with nothing to report it returns None
after a short pause, so a handler waiting for others ends at its join timeout.
:meth:`MemoryKV.when_watched` writes what other nodes would write, once, when the
handler starts watching a key (the round's control keys, the run's keys).
:func:`native_handler` builds a real :class:`EtcdNativeHandler` over it.
"""

from __future__ import annotations

import itertools
import threading
import time
from base64 import b64decode
from collections.abc import Callable
from contextlib import ExitStack
from types import SimpleNamespace
from typing import Any
from unittest import mock

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import (
    RendezvousConnectionError,
    RendezvousParameters,
)

from elastic_train.agent.rendezvous import etcd_kv as ops
from elastic_train.agent.rendezvous import etcd_native
from elastic_train.agent.rendezvous.etcd_kv import Event, KeyValue, TxnResult
from elastic_train.agent.rendezvous.etcd_v3 import run_prefix

RUN_LEASE = 1  # the id of the run's shared lease in a MemoryKV


def _key(request: dict[str, Any]) -> tuple[bytes, bytes | None]:
    end = request.get("range_end")
    return b64decode(request["key"]), None if end is None else b64decode(end)


def _in(key: bytes, start: bytes, end: bytes | None) -> bool:
    return key == start if end is None else start <= key < end


class MemoryKV:
    """One etcd keyspace; the methods of EtcdKV the handler calls."""

    def __init__(self) -> None:
        self.client = SimpleNamespace(base_url="memory://")
        self.data: dict[bytes, KeyValue] = {}
        self.revision = 1
        self.log: list[Event] = []
        self.leases = {RUN_LEASE}
        self._ids = itertools.count(100)
        self._lock = threading.RLock()
        self._hooks: list[tuple[bytes, Callable[[MemoryKV], None]]] = []
        self._followers: list[MemoryWatch] = []

    def _changed(self) -> None:
        """Hands the latest change to the watches that follow it."""
        for watch in list(self._followers):
            watch.deliver()

    # --- what a test does ---------------------------------------------------------------

    def put(self, key: bytes, value: bytes, lease: int = 0) -> int:
        """Writes ``key`` as another client would; returns the revision."""
        with self._lock:
            self.revision += 1
            self._put(key, value, lease)
            self._changed()
            return self.revision

    def when_watched(self, key: bytes, action: Callable[[MemoryKV], None]) -> None:
        """Runs ``action(self)`` once, when the handler first waits on a watch of ``key``
        (or of a prefix of it)."""
        self._hooks.append((key, action))

    def _watched(self, key: bytes) -> None:
        for hook in [h for h in self._hooks if h[0].startswith(key) or key.startswith(h[0])]:
            self._hooks.remove(hook)
            hook[1](self)

    # --- EtcdKV's interface -------------------------------------------------------------

    def txn(self, compare: list[dict], success: list[dict],
            failure: list[dict] | None = None) -> TxnResult:
        with self._lock:
            ok = self._holds(compare)
            plan = self._plan(success if ok else failure or [])
            before = self.revision
            self.revision += 1  # taken back below if nothing changed
            ranges: list[list[KeyValue]] = []
            counts: list[int] = []
            nested: list[bool] = []
            changed = self._run(plan, ranges, counts, nested)
            if not changed:
                self.revision = before
            else:
                self._changed()
            return TxnResult(ok, self.revision, ranges, counts, nested)

    def read(self, *ops: dict) -> TxnResult:
        return self.txn([], list(ops))

    def grant(self, ttl: int) -> tuple[int, int]:
        with self._lock:
            lease = next(self._ids)
            self.leases.add(lease)
            return lease, ttl

    def keep_alive(self, leases: list[int]) -> dict[int, int]:
        return {lease: (5 if lease in self.leases else 0) for lease in leases}

    def revoke(self, lease: int) -> None:
        with self._lock:
            self.leases.discard(lease)
            gone = [k for k, kv in self.data.items() if kv.lease == lease]
            if gone:
                self.revision += 1
                for key in gone:
                    self._delete(key)

    def watch(self, key: bytes, start_revision: int, prefix: bool = True) -> MemoryWatch:
        return MemoryWatch(self, key, start_revision, prefix)

    # --- inside a transaction -----------------------------------------------------------

    def _holds(self, compare: list[dict]) -> bool:
        for c in compare:
            key, _ = _key(c)
            kv = self.data.get(key)
            if c["target"] == "CREATE":
                found = kv.create_revision if kv else 0
                wanted = int(c["create_revision"])
            elif c["target"] == "MOD":
                found = kv.mod_revision if kv else 0
                wanted = int(c["mod_revision"])
            else:  # VALUE
                found = kv.value if kv else None
                wanted = b64decode(c["value"])
            if found != wanted:  # only EQUAL is used
                return False
        return True

    def _plan(self, ops: list[dict]) -> list[tuple[dict, Any]]:
        """Each operation with, for a nested transaction, its branch decided now (before
        any operation runs, as etcd does)."""
        plan = []
        for op in ops:
            if "request_txn" in op:
                t = op["request_txn"]
                ok = self._holds(t["compare"])
                plan.append((op, (ok, self._plan(t["success"] if ok else t["failure"]))))
            else:
                plan.append((op, None))
        return plan

    def _run(self, plan: list[tuple[dict, Any]], ranges: list, counts: list,
             nested: list | None) -> bool:
        changed = False
        for op, branch in plan:
            if "request_put" in op:
                r = op["request_put"]
                lease = int(r.get("lease", 0))
                if lease and lease not in self.leases:
                    raise RendezvousConnectionError("The etcd request failed: "
                                                    "etcdserver: requested lease not found")
                key, _ = _key(r)
                self._put(key, b64decode(r["value"]), lease)
                changed = True
            elif "request_delete_range" in op:
                start, end = _key(op["request_delete_range"])
                for key in [k for k in self.data if _in(k, start, end)]:
                    self._delete(key)
                    changed = True
            elif "request_range" in op:
                r = op["request_range"]
                start, end = _key(r)
                found = sorted((kv for k, kv in self.data.items() if _in(k, start, end)),
                               key=lambda kv: kv.key)
                if r.get("keys_only"):
                    found = [KeyValue(kv.key, b"", kv.create_revision, kv.mod_revision,
                                      kv.lease) for kv in found]
                ranges.append([] if r.get("count_only") else found)
                counts.append(len(found))
            else:  # request_txn: its ranges are not reported, as EtcdKV.txn reads them
                ok, inner = branch
                changed |= self._run(inner, [], [], None)
                if nested is not None:
                    nested.append(ok)
        return changed

    def _put(self, key: bytes, value: bytes, lease: int) -> None:
        old = self.data.get(key)
        kv = KeyValue(key, value, old.create_revision if old else self.revision,
                      self.revision, lease)
        self.data[key] = kv
        self.log.append(Event(False, kv))

    def _delete(self, key: bytes) -> None:
        old = self.data.pop(key)
        self.log.append(Event(True, KeyValue(key, b"", old.create_revision, self.revision, 0)))


class MemoryWatch:
    """A watch on a MemoryKV: the logged changes from its start revision on (0: from the
    revision after the current one)."""

    def __init__(self, kv: MemoryKV, key: bytes, start_revision: int, prefix: bool) -> None:
        self._kv, self._key, self._prefix = kv, key, prefix
        self.revision = start_revision or kv.revision + 1
        self._cancelled = False

    def start(self, timeout: float | None = None) -> None:
        """Nothing to open: the watch sees the log from its revision on."""

    def _events(self) -> list[Event]:
        self._kv._watched(self._key)
        with self._kv._lock:
            return [e for e in self._kv.log if e.kv.mod_revision >= self.revision and (
                e.kv.key.startswith(self._key) if self._prefix else e.kv.key == self._key)]

    def next(self, timeout: float) -> list[Event] | None:
        events = [] if self._cancelled else self._events()
        if not events:
            time.sleep(min(max(timeout, 0), 0.005))
            return None
        self.revision = max(e.kv.mod_revision for e in events) + 1
        return events

    def restart(self, timeout: float | None = None) -> None:
        """Watches from now on."""
        self.revision = self._kv.revision + 1

    def follow(self, on_events: Callable[[list[Event]], None],
               check: Callable[[Exception | None], list[Event]], every: float) -> None:
        """Delivers what is there now, and each later change as the KV makes it, in the
        thread that makes it (no thread of its own; a change is never lost, so ``check``
        is never needed)."""
        self._on_events = on_events
        self._kv._followers.append(self)
        self.deliver()

    def unfollow(self) -> None:
        if self in self._kv._followers:
            self._kv._followers.remove(self)

    def deliver(self) -> None:
        if self._cancelled:
            return
        events = self._events()
        if events:
            self.revision = max(e.kv.mod_revision for e in events) + 1
            self._on_events(events)

    def cancel(self) -> None:
        self._cancelled = True
        self.unfollow()


class MemoryKeyspace:
    """The run's keyspace (``EtcdV3Keyspace``) as the native handler uses it."""

    def __init__(self, kv: MemoryKV, run_id: str) -> None:
        self._kv = kv
        self.prefix = run_prefix(run_id).encode()
        self.lease_id = RUN_LEASE
        self.refresh_interval = 3600.0

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        pass

    def delete_all(self) -> None:
        self._kv.txn([], [ops.delete(self.prefix, prefix=True)])


def native_handler(kv: MemoryKV, run_id: str = "fuzz", min_nodes: int = 1,
                   max_nodes: int = 1, local_addr: str = "127.0.0.1",
                   **conf: Any) -> etcd_native.EtcdNativeHandler:
    """Our etcd handler over ``kv``, as node ``local_addr``: its own code throughout, the
    etcd calls answered in memory (the round's agent store is a HashStore)."""
    params = RendezvousParameters("etcd", "memory:2379", run_id, min_nodes, max_nodes,
                                  local_addr=local_addr, **conf)
    with ExitStack() as patches:
        for name, fake in (("create_client", lambda params: kv.client),
                           ("EtcdKV", lambda client: kv),
                           ("EtcdV3Keyspace", lambda client, run_id, ttl, refresh_thread:
                            MemoryKeyspace(kv, run_id)),
                           ("EtcdV3Store", lambda keyspace, timeout: dist.HashStore())):
            patches.enter_context(mock.patch.object(etcd_native, name, fake))
        return etcd_native.EtcdNativeHandler(params)


def keys_of(run_id: str = "fuzz") -> etcd_native.Keys:
    """Where the native handler of ``run_id`` keeps each piece of its rendezvous."""
    return etcd_native.Keys(run_prefix(run_id).encode() + b"native/")


def sealed_with_a_second_joiner(policy: object | None):
    """Node 10.0.0.2 has joined round 0 when node 127.0.0.1 joins, claims the sealer's part
    and seals (``max_nodes`` 2, a short last call); returns the sealer's rendezvous, the
    keys and the other node's handler."""
    kv = MemoryKV()
    other = native_handler(kv, min_nodes=1, max_nodes=2, local_addr="10.0.0.2",
                           join_timeout=5)
    keys = keys_of()
    kv.put(keys.round, b"0")
    kv.put(keys.join(0, other._node), b"", kv.grant(5)[0])  # under its lease, as a node
    conf = {"node_policy": policy} if policy is not None else {}
    sealer = native_handler(kv, min_nodes=1, max_nodes=2, join_timeout=5,
                            last_call_timeout=0.2, **conf)
    return sealer.next_rendezvous(), keys, other, kv
