"""What the native etcd rendezvous keeps in etcd, and the settings it reads.

:class:`Keys` is where each piece of a run's rendezvous lives, :class:`Seal` the
formed round as its sealer writes it, :class:`Settings` torch's rendezvous
parameters with torch's defaults; :func:`ours` and :func:`name_of` read the keys
the nodes wrote. See :mod:`.etcd_native` for the protocol, :mod:`.etcd_sealer`
for the seal.
"""

from __future__ import annotations

import itertools
import json
import socket
from dataclasses import dataclass
from urllib.parse import unquote

from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousParameters,
    RendezvousStateError,
)

from elastic_train.agent.rendezvous.etcd_kv import KeyValue


@dataclass(frozen=True)
class Settings:
    """The rendezvous parameters this handler uses, with torch's defaults."""

    run_id: str
    min_nodes: int
    max_nodes: int
    join_timeout: float = 600.0
    last_call_timeout: float = 30.0
    close_timeout: float = 30.0
    keep_alive_interval: float = 5.0
    keep_alive_max_attempt: int = 3
    store_timeout: float = 60.0
    local_addr: str = ""
    liveness_ttl: int = 1
    watch_check_interval: float = 5.0

    @staticmethod
    def of(params: RendezvousParameters) -> Settings:
        def seconds(key: str, default: float) -> float:
            value = float(params.get(key, default))
            if value <= 0:
                raise ValueError(f"The rendezvous option {key}={value} must be positive.")
            return value

        return Settings(
            params.run_id, params.min_nodes, params.max_nodes,
            join_timeout=seconds("join_timeout", 600), last_call_timeout=seconds(
                "last_call_timeout", 30), close_timeout=seconds("close_timeout", 30),
            keep_alive_interval=seconds("keep_alive_interval", 5),
            keep_alive_max_attempt=int(seconds("keep_alive_max_attempt", 3)),
            store_timeout=seconds("read_timeout", 60),
            local_addr=params.local_addr or socket.getfqdn(),
            liveness_ttl=max(1, round(seconds("liveness_ttl", 1))),
            watch_check_interval=seconds("watch_check_interval", 5))

    @property
    def lease_ttl(self) -> int:
        """A node is lost after this many seconds without a refresh (as torch's heartbeat)."""
        return max(1, round(self.keep_alive_interval * self.keep_alive_max_attempt))


class Keys:
    """Where each piece of a run's rendezvous lives in etcd."""

    def __init__(self, prefix: bytes) -> None:
        self.base = prefix
        self.run = prefix + b"run/"
        self.round = self.run + b"round"
        self.closed = self.run + b"closed"
        self.left = prefix + b"left/"

    def of_round(self, r: int) -> bytes:
        return self.base + b"r/%d/" % r

    def ctl(self, r: int) -> bytes:
        return self.of_round(r) + b"c/"

    def seal(self, r: int) -> bytes:
        return self.ctl(r) + b"seal"

    def sealer(self, r: int) -> bytes:
        return self.ctl(r) + b"sealer"

    def closed_in(self, r: int) -> bytes:
        return self.ctl(r) + b"closed"

    def wanted(self, r: int) -> bytes:
        """Present once a node wants round ``r``: a member of round r-1 re-joined, or a
        node that came too late for r-1 waits. Among round r's control keys, which the
        members of r-1 watch from their rendezvous on, and await r's seal with."""
        return self.ctl(r) + b"wanted"

    def joins(self, r: int) -> bytes:
        return self.of_round(r) + b"j/"

    def join(self, r: int, node: str) -> bytes:
        return self.joins(r) + node.encode()

    def refused(self, r: int, node: str) -> bytes:
        """Why the sealer of round ``r`` left ``node`` out (its node policy's reason)."""
        return self.ctl(r) + b"refused/" + node.encode()

    def lives(self, r: int) -> bytes:
        """The liveness records of round ``r``'s joined nodes that have not left it."""
        return self.of_round(r) + b"l/"

    def live(self, r: int, node: str) -> bytes:
        return self.lives(r) + node.encode()

    def spares(self, r: int) -> bytes:
        """The spares waiting for round ``r`` (it had ``max_nodes`` when they came)."""
        return self.of_round(r) + b"s/"

    def spare(self, r: int, node: str) -> bytes:
        return self.spares(r) + node.encode()


@dataclass(frozen=True)
class Seal:
    """A formed round: its members' join revisions in rank order (the sealer, rank 0,
    first) and where the workers' bootstrap store listens (on rank 0)."""

    first: int
    others: tuple[int, ...]
    addr: str
    bootstrap_port: int
    revision: int = 0  # etcd's revision of the seal (not stored)

    @property
    def world_size(self) -> int:
        return 1 + len(self.others)

    def rank_of(self, join_revision: int) -> int | None:
        if join_revision == self.first:
            return 0
        try:
            return 1 + self.others.index(join_revision)
        except ValueError:
            return None

    def encode(self) -> bytes:
        """Compact: sorted revisions as differences (a few bytes per node)."""
        deltas = [b - a for a, b in zip((0, *self.others), self.others, strict=False)]
        return json.dumps([self.first, deltas, self.addr, self.bootstrap_port],
                          separators=(",", ":")).encode()

    @staticmethod
    def of(kv: KeyValue) -> Seal:
        """The seal held by ``kv`` (see :meth:`decode`)."""
        return Seal.decode(kv.value, kv.mod_revision, kv.key)

    @staticmethod
    def decode(data: bytes, revision: int, key: bytes = b"") -> Seal:
        """The seal as :meth:`encode` wrote it; RendezvousStateError, naming ``key`` (where
        it was read), for anything else: a seal not quite right pairs nodes wrongly (two
        members of one revision share a rank, and the round waits for its missing one)."""
        try:
            found = json.loads(data)
        except (ValueError, RecursionError) as exc:  # json's errors are ValueErrors
            raise _bad_seal(data, key, f"not JSON ({exc})") from None
        if not (isinstance(found, list) and len(found) == 4):
            raise _bad_seal(data, key, "not a list of 4 items")
        first, deltas, addr, bootstrap_port = found
        # Checked in C (set, map, min): each of a thousand nodes reads a 1,024-node seal.
        if not (_is_int(first) and first > 0 and isinstance(deltas, list)
                and set(map(type, deltas)) <= {int} and (not deltas or min(deltas) > 0)):
            raise _bad_seal(data, key, "its revisions are not increasing positive integers")
        if not (isinstance(addr, str) and addr and _is_int(bootstrap_port)
                and 0 < bootstrap_port < 65536):
            raise _bad_seal(data, key, "not a host and a port from 1 to 65535")
        others = tuple(itertools.accumulate(deltas))
        if first in others:
            raise _bad_seal(data, key, "two members have one revision")
        return Seal(first, others, addr, bootstrap_port, revision)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bad_seal(data: bytes, key: bytes, why: str) -> RendezvousStateError:
    where = f"etcd key {key.decode(errors='replace')}" if key else "a round's seal"
    return RendezvousStateError(f"{where} holds {data[:60]!r}, not a seal as a round's sealer "
                                f"writes it: {why}")


def round_number(kv: KeyValue) -> int:
    """The round number stored in ``kv``, as the handler writes it (decimal digits, no
    sign, space or leading zero); RendezvousStateError for anything else (each node would
    otherwise follow a round of its own making, or one the handler's own comparisons,
    made with the number as it writes it, never match)."""
    value = kv.value
    if value.isdigit() and len(value) < 20 and value == b"%d" % int(value):
        return int(value)
    raise RendezvousStateError(
        f"etcd key {kv.key.decode(errors='replace')} holds {value[:60]!r}, not a round "
        "number")


def ours(kv: KeyValue) -> bool:
    """Whether a node of the run wrote ``kv``: every key the handler writes carries a
    lease (the node's own or the run's), so a key without one is a stray write (an
    operator's ``etcdctl put``) and counts for nothing: not as a member, a waiting node
    or a node gone."""
    return kv.lease != 0


def name_of(node: str) -> str:
    """The name a node's policy knows it by (its ``local_addr``) from its key in etcd."""
    return unquote(node).rsplit("_", 2)[0]


def closed_error(run_id: str) -> RendezvousClosedError:
    """The error of a node that finds the rendezvous of ``run_id`` closed."""
    return RendezvousClosedError(f"The rendezvous of {run_id} is closed.")
