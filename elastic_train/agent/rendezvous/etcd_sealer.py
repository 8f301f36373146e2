"""The sealer of a round of the native etcd rendezvous: who is in it, and its seal.

The first node to join round R (see :mod:`.etcd_native` for the whole protocol) holds
the sealer's part, ``r/R/c/sealer`` under its lease. Its handler then hands the round
to :class:`RoundSealer`, which follows the round's joins on one watch and writes
``r/R/c/seal`` in one transaction once

- ``max_nodes`` have joined,
- ``min_nodes`` have joined and no member of round R-1 still alive is to come (no
  liveness record of R-1 left, asked every ``ALIVE_EVERY_S``), or
- ``min_nodes`` have joined for ``last_call_timeout`` seconds,

counting only the nodes its node policy admits (:mod:`elastic_train.agent.node_policy`;
it admits itself: its agent asked before joining). The seal lists the members in rank
order: the sealer first (it hosts the workers' bootstrap store), then the others in join
order; the same transaction writes ``r/R/c/refused/<node>`` with the reason for each node
left out. A watch that brings nothing for ``watch_check_interval`` seconds, or breaks and
cannot resume, is replaced by one from now, and the round's keys are read once.

The handler keeps joining, waiting and leaving; what it lends the sealer for one round
(how to wait on a watch until the join deadline, whether this node lost its join
meanwhile) is a :class:`SealerTurn`.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousConnectionError
from torch.distributed.elastic.utils.distributed import get_free_port

from elastic_train.agent.node_policy import ADMITTED, Candidate
from elastic_train.agent.rendezvous import etcd_kv as ops
from elastic_train.agent.rendezvous.etcd_rounds import Seal, closed_error, name_of, ours

if TYPE_CHECKING:
    from elastic_train.agent.node_policy import NodePolicy
    from elastic_train.agent.rendezvous.etcd_kv import EtcdKV, Watch
    from elastic_train.agent.rendezvous.etcd_rounds import Keys, Settings

log = logging.getLogger(__name__)

ALIVE_EVERY_S = 0.1  # how often a sealer with min_nodes asks whether every live member came


@dataclass(frozen=True)
class SealerTurn:
    """What the handler lends the sealer to seal round ``round``.

    ``wait(watch, until)``: the watch's next events, waiting at most until ``until``
    (``time.monotonic()`` seconds), None if none came; past the join deadline the
    handler leaves the round and raises RendezvousTimeoutError. ``lost()``: whether
    this node's lease was renewed since it joined (its join, and the part, are gone).
    ``host_store``: whether the sealer hosts the workers' bootstrap store (torch's
    ``use_agent_store``), else names a free port for rank 0's worker to host it.
    """

    round: int
    wait: Callable[[Watch, float], list[ops.Event] | None]
    lost: Callable[[], bool]
    host_store: bool


class _View:
    """The sealer's view of a round: the nodes joined (join key -> create revision) and
    those of them its node policy refuses (join key -> why), each asked once."""

    def __init__(self, refusal: Callable[[bytes], str]) -> None:
        self.joined: dict[bytes, int] = {}
        self.refused: dict[bytes, str] = {}
        self._refusal = refusal

    def add(self, key: bytes, revision: int) -> None:
        if key not in self.joined:
            self.joined[key] = revision
            if why := self._refusal(key):
                self.refused[key] = why

    def drop(self, key: bytes) -> None:
        self.joined.pop(key, None)
        self.refused.pop(key, None)

    @property
    def admitted(self) -> int:
        return len(self.joined) - len(self.refused)

    def members(self) -> dict[bytes, int]:
        """The joined nodes the policy admits."""
        return {key: rev for key, rev in self.joined.items() if key not in self.refused}


class RoundSealer:
    """Seals rounds for one node (``node``, its key in etcd), as the module describes.

    Built once per handler; :meth:`seal` runs for each round whose part this node holds,
    and :meth:`take_store` hands over the bootstrap store of the round it sealed.
    """

    def __init__(self, kv: EtcdKV, keys: Keys, settings: Settings, node: str,
                 run_lease: int, policy: NodePolicy) -> None:
        self._kv, self._keys, self._settings = kv, keys, settings
        self._node, self._run_lease, self._policy = node, run_lease, policy
        self._hosted: dist.Store | None = None  # the store of the round it sealed

    def take_store(self) -> dist.Store | None:
        """The workers' bootstrap store this node hosts for the round it sealed last (None
        if it hosts none), no longer held here."""
        store, self._hosted = self._hosted, None
        return store

    def seal(self, turn: SealerTurn) -> Seal | None:
        """Follows round ``turn.round``'s joins and seals it, as the module describes; the
        seal (this node's, or one another node wrote), or None if it lost the part.
        RendezvousClosedError if the rendezvous closes meanwhile."""
        keys, settings, r = self._keys, self._settings, turn.round
        found = self._kv.read(ops.get(keys.joins(r), prefix=True, keys_only=True))
        view = _View(functools.partial(self._refusal, r))
        for kv in found.ranges[0]:
            if ours(kv):
                view.add(kv.key, kv.create_revision)
        watch = self._kv.watch(keys.of_round(r), found.revision + 1)
        enough_since: float | None = None
        ask_at = 0.0  # when to ask next whether every live member of round r-1 came
        checked = time.monotonic()  # when the watch last brought a change, or was checked
        try:
            while True:
                now = time.monotonic()
                admitted = view.admitted
                if admitted < settings.min_nodes:
                    enough_since = None
                elif enough_since is None:
                    enough_since = now
                all_came = False
                if enough_since is not None and now >= ask_at and r > 0:
                    ask_at = now + ALIVE_EVERY_S
                    all_came = self._all_alive_joined(r, view)
                if admitted >= settings.max_nodes or all_came or enough_since is not None \
                        and now >= enough_since + settings.last_call_timeout:
                    return self._publish(r, view, turn.host_store)
                last_call = None if enough_since is None else min(
                    enough_since + settings.last_call_timeout, now + ALIVE_EVERY_S)
                try:
                    events = turn.wait(watch, min(last_call or math.inf,
                                                  checked + settings.watch_check_interval))
                except RendezvousConnectionError as exc:  # cannot resume: see _look_again
                    log.warning("The sealer's watch of round %d broke and cannot resume "
                                "(%s); watching it anew.", r, exc)
                    events, checked = None, -math.inf
                if turn.lost():
                    return None
                if events:
                    checked = time.monotonic()
                elif time.monotonic() >= checked + settings.watch_check_interval:
                    checked = time.monotonic()
                    seal = self._look_again(r, watch, view)
                    if seal is not None:
                        return seal
                for event in events or []:
                    seal = self._follow(r, event, view)
                    if seal is not None:
                        return seal
        finally:
            watch.cancel()

    def _look_again(self, r: int, watch: Watch, view: _View) -> Seal | None:
        """The sealer's ``watch`` of round ``r`` brought nothing for a while, or broke and
        cannot resume (as a member's, see ``EtcdNativeHandler._missed``): it watches anew
        from now and reads the round's joins, seal and close once into its view (as
        :meth:`_follow` would the changes); the seal if there is one. One node seals a
        round, so this costs etcd little."""
        keys = self._keys
        watch.restart()
        found = self._kv.read(ops.get(keys.joins(r), prefix=True, keys_only=True),
                              ops.get(keys.seal(r)), ops.get(keys.closed_in(r)))
        joins, seal, closed = found.ranges
        if closed:
            raise closed_error(self._settings.run_id)
        if seal:
            return Seal.of(seal[0])
        now = {kv.key: kv.create_revision for kv in joins if ours(kv)}
        for key in set(view.joined) - set(now):
            view.drop(key)
        for key, revision in now.items():
            view.add(key, revision)
        return None

    def _all_alive_joined(self, r: int, view: _View) -> bool:
        """Whether every member of round r-1 still alive has left it (joined round r): no
        liveness record of r-1 is left. If so, the joins of round r, read after that
        answer, are added to the sealer's view (its watch may not have shown them yet;
        a member leaves r-1 and joins r in one transaction, so every such join is read).
        The joins are read only then: the sealer asks every ``ALIVE_EVERY_S``, and at
        1,024 nodes each read of them is a thousand keys."""
        keys = self._keys
        if self._kv.read(ops.get(keys.lives(r - 1), prefix=True, count_only=True)).counts[0]:
            return False
        found = self._kv.read(ops.get(keys.joins(r), prefix=True, keys_only=True))
        for kv in found.ranges[0]:
            if ours(kv):
                view.add(kv.key, kv.create_revision)
        return True

    def _follow(self, r: int, event: ops.Event, view: _View) -> Seal | None:
        """Applies one event of round ``r`` to the sealer's view; a seal if one appeared."""
        keys, key = self._keys, event.kv.key
        if key.startswith(keys.joins(r)):
            if event.deleted:
                view.drop(key)
            elif ours(event.kv):
                view.add(key, event.kv.create_revision)
        elif key == keys.closed_in(r):
            raise closed_error(self._settings.run_id)
        elif key == keys.seal(r) and not event.deleted:
            return Seal.of(event.kv)
        return None

    def _refusal(self, r: int, key: bytes) -> str:
        """Why the node policy refuses the node that joined round ``r`` as ``key`` ("" when
        it is admitted; this node always is)."""
        node = key[len(self._keys.joins(r)):].decode()
        admission = ADMITTED if node == self._node else self._policy.admit(
            Candidate(name_of(node)))
        return "" if admission.admitted else admission.reason

    def _publish(self, r: int, view: _View, host_store: bool) -> Seal | None:
        """Writes round ``r``'s seal in one transaction, if this node still is its sealer:
        itself as rank 0 (it hosts the round's store), the admitted others in join order;
        and why each refused node was left out."""
        keys, settings = self._keys, self._settings
        joined = view.members()
        mine = joined.get(keys.join(r, self._node))
        if mine is None:
            return None
        others = sorted(rev for key, rev in joined.items() if rev != mine)
        server = dist.TCPStore(settings.local_addr, 0, is_master=True, wait_for_workers=False,
                               multi_tenant=True, timeout=timedelta(seconds=settings.store_timeout)
                               ) if host_store else None
        bootstrap = server.port if server is not None else get_free_port()
        seal = Seal(mine, tuple(others[:settings.max_nodes - 1]), settings.local_addr, bootstrap)
        result = self._kv.txn(
            [ops.absent(keys.seal(r)), ops.value_is(keys.sealer(r), self._node.encode())],
            [ops.put(keys.seal(r), seal.encode(), self._run_lease),
             *(ops.put(keys.refused(r, key[len(keys.joins(r)):].decode()),
                       reason.encode(), self._run_lease)
               for key, reason in view.refused.items())],
            [ops.get(keys.seal(r))])
        if result.succeeded:
            self._hosted = server
            return Seal(**{**seal.__dict__, "revision": result.revision})
        found = result.ranges[0]
        return Seal.of(found[0]) if found else None
