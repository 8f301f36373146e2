"""Which nodes of the current round are known gone: a node's loss seen in well under a second.

Every agent keeps a *beacon*: a listening socket that answers each connection
with the agent's token and closes it. At each round the agent publishes
``host:port:token`` under ``elastic_train/liveness/<group rank>`` in the
round's store (any backend's: c10d's TCPStore, etcd). A peer is *gone* when
its beacon refuses the connection or closes it unanswered (its agent died:
the kernel closes a dead process's sockets at once, so a SIGKILLed node is
known gone within milliseconds), answers with another token (the port went to
another process), or cannot be reached within ``probe_timeout_s`` (its host is
down). A live agent that is slow (starved, stopped) still has its socket in
the kernel's listen queue: it counts as alive.

Probes cost nothing while nothing fails: they are sent only when the agent
asks :meth:`NodeLiveness.gone`, after a failure, for the nodes it still waits
for. Once known gone, a node stays gone for the round (a new round makes a
new :class:`NodeLiveness`). With the native etcd backend, a node's loss is
also visible in etcd without any probe, to nodes that are not waiting for it
(:mod:`elastic_train.agent.rendezvous.etcd_native`'s liveness records, which
let a round seal once every live member joined).

The waits that use it: the failure exchange (:mod:`.attribution`), the
in-process barrier and peer wait (:mod:`.inprocess.attempt_store`); a failure
seen while a node is known gone is a membership change, charged to nobody who
survived it.

Example::

    beacon = Beacon("node-a")                  # once per agent
    liveness = NodeLiveness(store, group_rank=0, nodes=3, beacon=beacon)
    liveness.publish()                         # after each rendezvous
    liveness.gone()                            # {2}: node 2's agent is dead
"""

from __future__ import annotations

import logging
import socket
import threading
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

logger = logging.getLogger(__name__)

_KEY = "elastic_train/liveness/"
PROBE_TIMEOUT_S = 0.5  # a host that does not answer a TCP connect within this is down
_PROBES = 32  # probes in flight at once


class Beacon:
    """This agent's listening socket (all interfaces, a free port), answered by a daemon
    thread until :meth:`close`; ``host`` is the name its peers reach it by."""

    def __init__(self, host: str) -> None:
        self.token = uuid.uuid4().hex
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("", 0))
        self._sock.listen(128)
        self.address = f"{host}:{self._sock.getsockname()[1]}:{self.token}"
        self._closed = False
        threading.Thread(target=self._answer, name="node-liveness-beacon", daemon=True).start()

    def _answer(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.sendall(self.token.encode())
                except OSError:
                    pass

    def close(self) -> None:
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()


def probe(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether the agent whose beacon published ``address`` is gone (see the module doc)."""
    try:
        return _answer(address, timeout_s) != address.rsplit(":", 1)[1]
    except TimeoutError:  # connected, but its agent has not answered yet: slow, alive
        return False


def answers(address: str, timeout_s: float) -> bool:
    """Whether the beacon that published ``address`` answers with its token within
    ``timeout_s``: stricter than :func:`probe`, for a question where a port that
    another program took since, and holds silently, must not pass for the beacon."""
    try:
        return _answer(address, timeout_s) == address.rsplit(":", 1)[1]
    except TimeoutError:
        return False


def _answer(address: str, timeout_s: float) -> str | None:
    """What the beacon at ``address`` answers (at most its token's length), None if it
    cannot be reached or resets; TimeoutError when it connects but does not answer."""
    host, port, token = address.rsplit(":", 2)
    try:
        conn = socket.create_connection((host, int(port)), timeout=timeout_s)
    except OSError:  # refused, unreachable, no answer within timeout_s (a TimeoutError)
        return None
    got = b""
    with conn:
        conn.settimeout(timeout_s)
        try:
            while len(got) < len(token):
                chunk = conn.recv(len(token) - len(got))
                if not chunk:
                    break
                got += chunk
        except TimeoutError:  # connected, not answered yet: the caller decides what it means
            raise
        except OSError:  # reset
            return None
    return got.decode(errors="replace")


class NodeLiveness:
    """The nodes of one round known gone, as this agent (``group_rank`` of ``nodes``) sees
    them through the round's ``store``: its peers' beacons (see the module doc).

    Small on purpose: :meth:`publish` once per round, :meth:`gone` whenever a wait must
    know whether to go on waiting. Errors of the store (its host is gone too) make
    :meth:`gone` answer from what it knows.
    """

    def __init__(self, store: Any, group_rank: int, nodes: int, beacon: Beacon,
                 probe_timeout_s: float = PROBE_TIMEOUT_S) -> None:
        self.store, self.group_rank, self.nodes = store, group_rank, nodes
        self.beacon = beacon
        self.probe_timeout_s = probe_timeout_s
        self._addresses: dict[int, str] = {}
        self._gone: set[int] = set()
        self._lock = threading.Lock()

    def publish(self) -> None:
        """Tells the round's other nodes where this agent's beacon is."""
        if self.nodes > 1:
            self.store.set(f"{_KEY}{self.group_rank}", self.beacon.address)

    def known_gone(self) -> set[int]:
        """The group ranks found gone so far, without probing anyone (a job of 1,024
        nodes would open a thousand connections per node for a new probe)."""
        with self._lock:
            return set(self._gone)

    def gone(self, ranks: Iterable[int] | None = None) -> set[int]:
        """The group ranks known gone: of ``ranks`` (default: every other node of the
        round), probed now unless known gone already. A node that has not published
        its beacon yet is not known gone."""
        wanted = set(range(self.nodes)) if ranks is None else set(ranks)
        wanted.discard(self.group_rank)
        with self._lock:
            ask = {rank: address for rank in wanted - self._gone
                   if (address := self._address(rank)) is not None}
            if ask:
                with ThreadPoolExecutor(min(_PROBES, len(ask))) as pool:
                    found = dict(zip(ask, pool.map(
                        lambda a: probe(a, self.probe_timeout_s), ask.values()), strict=True))
                newly = {rank for rank, dead in found.items() if dead}
                if newly:
                    logger.warning("The node(s) of group rank %s are gone: their agents do "
                                   "not answer.", sorted(newly))
                self._gone |= newly
            return self._gone & wanted

    def _address(self, rank: int) -> str | None:
        if rank not in self._addresses:
            key = f"{_KEY}{rank}"
            try:
                if not self.store.check([key]):
                    return None
                self._addresses[rank] = self.store.get(key).decode()
            except Exception as exc:  # noqa: BLE001 -- an unreachable store: answer from what is known
                logger.debug("Liveness record of rank %d unavailable (%r).", rank, exc)
                return None
        return self._addresses[rank]


def nobody() -> set[int]:
    """The answer of a node that knows of no liveness (a single node, no round yet)."""
    return set()
