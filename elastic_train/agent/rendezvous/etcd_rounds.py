"""What the native etcd rendezvous keeps in etcd, and the settings it reads.

:class:`Keys` is where each piece of a run's rendezvous lives, :class:`Seal` the
formed round as its sealer writes it, :class:`Settings` torch's rendezvous
parameters with torch's defaults. See :mod:`.etcd_native` for the protocol.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass

from torch.distributed.elastic.rendezvous import RendezvousParameters, RendezvousStateError

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
            local_addr=params.local_addr or socket.getfqdn())

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
        self.waiting = self.run + b"waiting"  # the round a newcomer waits for
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

    def joins(self, r: int) -> bytes:
        return self.of_round(r) + b"j/"

    def join(self, r: int, node: str) -> bytes:
        return self.joins(r) + node.encode()

    def spare(self, r: int, node: str) -> bytes:
        return self.of_round(r) + b"s/" + node.encode()


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
    def decode(data: bytes, revision: int) -> Seal:
        """The seal as :meth:`encode` wrote it; RendezvousStateError for anything else."""
        try:
            first, deltas, addr, bootstrap_port = json.loads(data)
            others, total = [], 0
            for delta in deltas:
                total += int(delta)
                others.append(total)
            return Seal(int(first), tuple(others), str(addr), int(bootstrap_port), revision)
        except (ValueError, TypeError) as exc:  # json's errors are ValueErrors
            raise RendezvousStateError(
                f"a round's seal holds {data[:60]!r}, not what a sealer writes") from exc


def round_number(kv: KeyValue) -> int:
    """The round number stored in ``kv``; RendezvousStateError if it holds something else
    (each node would otherwise follow a round of its own making)."""
    try:
        return int(kv.value)
    except ValueError:
        raise RendezvousStateError(
            f"etcd key {kv.key.decode(errors='replace')} holds {kv.value[:60]!r}, not a "
            "round number") from None
