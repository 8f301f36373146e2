"""A rendezvous handler native to etcd v3: O(N) work for N nodes, liveness by leases.

torch's DynamicRendezvousHandler keeps a whole job's rendezvous in one blob that
every join and every heartbeat rewrites by compare-and-set, so N nodes contend
N^2 times and 64 nodes no longer form (see bench figure 9). Here each node only
writes keys of its own, and learns what others did from watches:

- A node joins round R by writing ``r/R/j/<node>`` under its own lease
  (:class:`~.etcd_lease.NodeLease`, TTL = keep-alive interval x max attempts):
  liveness is etcd's lease expiry, not a heartbeat rewritten into shared state.
- The first joiner of a round becomes its *sealer* (``r/R/c/sealer``, created
  in the same transaction as its join; if it dies, its lease deletes the key and
  the next node claims it). The sealer watches the round's joins; the others
  watch only the round's control keys.
- With ``max_nodes`` joined, or ``min_nodes`` joined for ``last_call_timeout``
  seconds, the sealer (:mod:`.etcd_sealer`) writes ``r/R/c/seal`` in one
  transaction: the members in rank order (itself first, then by join order) and the
  address of the workers' bootstrap store. Every node learns its rank from that one
  event.
- A member that calls :meth:`next_rendezvous` again (its workers failed) opens
  round R+1 by moving ``run/round`` on and writing ``r/R+1/c/wanted``; a node
  arriving at a sealed round writes ``r/R+1/j/<node>`` (and ``r/R+1/c/wanted``)
  and waits for that. Once round R formed, its members watch round R+1's control
  keys (from the first call of :meth:`num_nodes_waiting`, which that watch then
  answers without a request: scale-up) and keep that watch to await R+1's seal
  with, so a re-form costs etcd one request per node, its join. A node without
  such a watch opens one on the round's control keys before it joins (a watch from
  the join's own revision would start behind etcd's: see ``etcd_kv.Watch``). A
  node arriving at a
  round of ``max_nodes`` waits as a spare (``r/R+1/s/<node>``), not counted, as
  torch's redundancy list. A dead node is simply absent from the next round
  (scale-down): nobody waits for its heartbeat to expire.
- A watch may break where it cannot resume (etcd compacted the history it was to
  resume from, e.g. across an etcd restart) or die silently (a NAT's or load
  balancer's idle timeout, a host gone: an idle stream and a dead one look the
  same). Every watch the handler keeps is checked by one read of the keys it
  watches after ``watch_check_interval`` seconds (default 5) without a change; one
  that broke, or whose keys show a change it did not bring, watches anew from now
  and its keys are read once (:meth:`EtcdNativeHandler._missed`).
- Each node that joined round R keeps a *liveness record* ``r/R/l/<node>``, written
  in its join's transaction, under a lease of its own with a short TTL
  (``liveness_ttl``, default 1 s; etcd raises
  a TTL below its minimum, 1.5 x its election timeout: 2 s with etcd's
  defaults), refreshed 3 times in the TTL etcd granted, as etcd's clients do,
  until it leaves R. So the sealer of round R+1 need not wait
  for the last call once every member of R that is still alive has joined: with
  ``min_nodes`` joined and no liveness record of R left, it seals at once. A lost
  node's record is gone within its TTL -- at once when the survivors' agents know
  it is gone (:meth:`EtcdNativeHandler.forget_gone`, from node liveness, deletes it
  in a thread while the survivors join: at 1,024 nodes, behind their joins in
  etcd's queue, the deletion took 1.5 s, which the lowest survivor's own join had
  waited for); a live
  node that is slow to come keeps its record, and the last call still bounds the
  wait for it.
- Closing writes ``run/closed`` (and into the current round, for its watchers).
- The sealer counts and seals only the nodes its node policy admits
  (:mod:`elastic_train.agent.node_policy`; it admits itself: its agent asked before
  joining). For each node left out it writes ``r/R/c/refused/<node>`` with the reason
  in the seal's transaction; that node, finding itself outside the seal, reads it and
  leaves the job (:class:`~elastic_train.errors.NodeLeftError`) instead of waiting
  for the next round.

What torch's agent and workers get is as with torch's own handler: a
``PrefixStore("torch.rendezvous.<run id>.<round>", store)`` for the agents (the
run's keys in etcd, :class:`~.etcd_v3.EtcdV3Store`: it survives the loss of any
node, and forming a round connects to no other node), and in
``bootstrap_store_info`` the workers' store on rank 0: a TCPStore that rank 0's
handler hosts (torch's default of a shared store; a new one each round, so no
key of an earlier round is ever read), or with
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` a free port there for rank 0's worker.

Keys live under ``/elastic_train/rdzv/<run id>/native/``; those of the run as a
whole carry the run's shared lease (``lease_ttl``, default 30 s), so a job that
died entirely leaves nothing behind for long, and the last node to shut down
deletes them at once.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from urllib.parse import quote

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import (
    RendezvousConnectionError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
    RendezvousTimeoutError,
)

from elastic_train.agent import node_policy
from elastic_train.agent.node_policy import POLICY_SETTING
from elastic_train.agent.rendezvous import etcd_kv as ops
from elastic_train.agent.rendezvous.etcd_kv import EtcdKV, Watch
from elastic_train.agent.rendezvous.etcd_lease import NodeLease
from elastic_train.agent.rendezvous.etcd_rounds import (
    Keys,
    Seal,
    Settings,
    closed_error,
    name_of,
    ours,
    round_number,
)
from elastic_train.agent.rendezvous.etcd_sealer import RoundSealer, SealerTurn
from elastic_train.agent.rendezvous.etcd_v3 import EtcdV3Keyspace, EtcdV3Store, create_client
from elastic_train.errors import NodeLeftError

log = logging.getLogger(__name__)

DEFAULT_RUN_LEASE_TTL = 30
# Rank r opens its watch of the next round r x this many seconds after the rendezvous: a
# thousand members that open theirs at once hold up the seal on its way to the last ones.
_WATCH_SPREAD_S = 0.001


@dataclass
class _Membership:
    """This node's place in the last round it formed."""

    round: int
    rank: int
    seal: Seal
    server: dist.Store | None = None  # the workers' bootstrap store, if this node hosts it
    waiting: _WaitingNodes | None = field(default=None, repr=False)
    formed_at: float = field(default_factory=time.monotonic)


class _WaitingNodes:
    """Counts the nodes waiting for round ``r``+1 without a request per call of
    :meth:`EtcdNativeHandler.num_nodes_waiting` (the agent asks every monitor interval).

    It follows ``watch``, on round r+1's control keys from after round r's seal, until
    ``r/R+1/c/wanted`` appears: a member re-joined, or a newcomer waits. The count then
    stays 1: a lower bound, which is all torch's agent asks (it re-rendezvouses when
    any node waits). Watching the next round's join keys to count them would send
    every member every join: N^2 events when N nodes re-join at once; counting them
    then, N requests at that moment. The watch is kept: :meth:`take` hands it, with
    the changes it saw, to this node's join of round r+1, which awaits the seal on it.
    """

    def __init__(self, watch: Watch, r: int, wanted: bytes,
                 missed: Callable[[Watch, Exception | None], list[ops.Event]],
                 every: float) -> None:
        self.count = 0
        self.round = r + 1
        self._wanted = wanted
        self._seen: list[ops.Event] = []
        self._watch = watch
        self._missed = missed
        watch.follow(self._update, self._check, every)

    def _check(self, why: Exception | None) -> list[ops.Event]:
        """What the watch did not bring (see ``EtcdNativeHandler._missed``); once a node
        waits, nothing: the join that takes the watch checks it again."""
        if why is None and self.count:
            return []
        return self._missed(self._watch, why)

    def _update(self, events: list[ops.Event]) -> None:
        self._seen.extend(events)
        if any(not e.deleted and ours(e.kv) and e.kv.key == self._wanted for e in events):
            self.count = 1

    def take(self) -> tuple[Watch, list[ops.Event]]:
        """The watch, no longer followed, and the changes it brought so far."""
        self._watch.unfollow()
        return self._watch, self._seen

    def stop(self) -> None:
        self._watch.cancel()


class _Late(Exception):
    """The round was sealed without this node; it waits for the next one."""

    def __init__(self, seal: Seal, revision: int) -> None:
        super().__init__("late")
        self.seal, self.revision = seal, revision


class EtcdNativeHandler(RendezvousHandler):
    """torch's ``RendezvousHandler`` over etcd v3, as the module docstring describes.

    ``params`` are torch's: ``min_nodes``/``max_nodes``, ``local_addr`` and the
    ``--rdzv-conf`` keys ``join_timeout``, ``last_call_timeout``, ``close_timeout``,
    ``keep_alive_interval``, ``keep_alive_max_attempt`` (torch's meanings and
    defaults) and ``read_timeout`` (the c10d store's, default 60 s), plus those of
    the etcd connection (:func:`~.etcd_v3.create_client`: endpoint, TLS, auth,
    ``timeout``, ``outage_timeout``), ``lease_ttl`` (the run's keys outlive its
    last node by this many seconds, default 30), ``watch_check_interval`` (seconds
    without a change after which a watch is checked, default 5) and ``liveness_ttl``
    (a lost node's liveness record is gone after this many seconds, default 1; see the
    module doc)."""

    def __init__(self, params: RendezvousParameters) -> None:
        self._settings = Settings.of(params)
        self._backend = params.backend
        client = create_client(params)
        self._kv = EtcdKV(client)
        self._run = EtcdV3Keyspace(client, params.run_id,
                                   int(params.get("lease_ttl", DEFAULT_RUN_LEASE_TTL)),
                                   refresh_thread=False)
        self._keys = Keys(self._run.prefix + b"native/")
        self._store = EtcdV3Store(self._run, timedelta(seconds=self._settings.store_timeout))
        self._node = quote(f"{self._settings.local_addr}_{os.getpid()}_{uuid.uuid4().hex[:8]}",
                           safe="")
        self._lease = NodeLease(self._kv, self._settings.lease_ttl,
                                self._settings.keep_alive_interval, self._node,
                                also=self._run.refresh, also_every=self._run.refresh_interval,
                                also_key=(client.base_url, self._run.lease_id))
        self._alive = NodeLease(self._kv, self._settings.liveness_ttl, 0.0,
                                f"{self._node} (liveness)", refreshes_per_ttl=3)
        self._round_hint = 0
        self._spare = False
        self._last: _Membership | None = None
        self._sealer = RoundSealer(self._kv, self._keys, self._settings, self._node,
                                   self._run.lease_id,
                                   node_policy.load(params.get(POLICY_SETTING)))

    # --- torch's interface ------------------------------------------------------------------

    def get_backend(self) -> str:
        return self._backend

    def get_run_id(self) -> str:
        return self._settings.run_id

    @property
    def use_agent_store(self) -> bool:
        """As torch's handler: workers share the round's store unless
        ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``."""
        return os.getenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "0") != "1"

    def next_rendezvous(self) -> RendezvousInfo:
        """Leaves this node's last round (opening the next) and joins the current one;
        blocks until it is sealed with this node in it, ``join_timeout`` passes
        (RendezvousTimeoutError) or the rendezvous is closed (RendezvousClosedError)."""
        deadline = time.monotonic() + self._settings.join_timeout
        leaving, self._last = self._last, None
        if leaving is not None:
            self._round_hint = leaving.round + 1
        while True:
            try:
                membership = self._join(deadline, leaving)
                leaving = None  # left with the first attempt, whatever its outcome
            except _Late as late:
                self._leave_if_refused(self._round_hint)
                self._wait_for_next_round(late.seal, late.revision, deadline)
                if self._spare:  # standing by is not joining: the timeout starts again
                    deadline = time.monotonic() + self._settings.join_timeout
                continue
            if membership is not None:
                return self._info(membership)

    def forget_gone(self, ranks: set[int]) -> threading.Thread | None:
        """Deletes the liveness records of this node's last round held by the members of
        group ranks ``ranks`` (known gone, see :mod:`.gone_nodes`), so that the next
        round's sealer need not wait out their TTL. Only the lowest-ranked survivor acts
        (one read of the round's join keys, one transaction), so a loss costs etcd the
        same at any size; it does so in a thread, which it returns (None on the other
        nodes), so that its agent joins the next round meanwhile."""
        last = self._last
        if last is None:
            return None
        survivors = set(range(last.seal.world_size)) - set(ranks)
        if not survivors or last.rank != min(survivors):
            return None
        thread = threading.Thread(target=self._delete_liveness, args=(last, ranks),
                                  name="rendezvous-forget", daemon=True)
        thread.start()
        return thread

    def _delete_liveness(self, last: _Membership, ranks: set[int]) -> None:
        keys, r = self._keys, last.round
        revisions = (last.seal.first, *last.seal.others)
        gone = {revisions[rank] for rank in ranks if 0 <= rank < len(revisions)}
        try:
            found = self._kv.read(ops.get(keys.joins(r), prefix=True, keys_only=True))
            nodes = [kv.key[len(keys.joins(r)):].decode() for kv in found.ranges[0]
                     if kv.create_revision in gone and ours(kv)]
            if nodes:
                self._kv.txn([], [ops.delete(keys.live(r, node)) for node in nodes])
        except RendezvousError as exc:  # their records expire with their leases
            log.warning("Could not drop the liveness records of the nodes of group rank(s) "
                        "%s, known gone (%s); the next round waits for them to expire.",
                        sorted(ranks), exc)

    def spares_waiting(self) -> int:
        """The spares waiting for the round after this node's last (their keys
        ``r/R+1/s/<node>``, under their leases: a dead spare's is gone with its lease);
        one read (see :mod:`.spares`)."""
        last = self._last
        if last is None:
            return 0
        found = self._kv.read(ops.get(self._keys.spares(last.round + 1), prefix=True,
                                      keys_only=True))
        return sum(ours(kv) for kv in found.ranges[0])

    def is_closed(self) -> bool:
        return bool(self._kv.read(ops.get(self._keys.closed)).ranges[0])

    def set_closed(self) -> None:
        keys, r = self._keys, self._round_hint
        lease = self._run.lease_id
        self._kv.txn([], [ops.put(key, b"1", lease)
                          for key in (keys.closed, keys.closed_in(r), keys.closed_in(r + 1))])

    def num_nodes_waiting(self) -> int:
        """Nodes waiting for the next round, from a watch of its control keys opened on the
        first call after a rendezvous (so that next_rendezvous returns without it), once
        ``rank`` ms have passed since (spread, so that a thousand nodes do not open theirs
        at once; until then 0: the watch, from the seal's revision, misses nothing)."""
        last = self._last
        if last is None:
            return 0
        if last.waiting is None:
            if time.monotonic() < last.formed_at + last.rank * _WATCH_SPREAD_S:
                return 0
            keys, r = self._keys, last.round
            last.waiting = _WaitingNodes(
                self._kv.watch(keys.ctl(r + 1), last.seal.revision + 1), r, keys.wanted(r + 1),
                functools.partial(self._missed, r + 1), self._settings.watch_check_interval)
        return last.waiting.count

    def shutdown(self) -> bool:
        """Closes the rendezvous, counts this node out of its last round (the last one out
        deletes the run's keys) and releases the leases; False if closing failed."""
        try:
            self.set_closed()
            closed = True
        except RendezvousError as exc:
            log.warning("Could not close the rendezvous of %s: %s", self._settings.run_id, exc)
            closed = False
        if self._last is not None:
            self._stop_waiting(self._last)
        self._count_out(self._last)
        self._lease.stop(revoke=True)
        self._alive.stop(revoke=True)
        self._run.close()
        self._last = None
        return closed

    def release(self) -> None:
        """Stops this node's lease refresh and watches, leaving the rendezvous open: the
        agent failed or was interrupted, and the other nodes may go on without it. Its
        keys expire with its lease (idempotent; after :meth:`shutdown`, nothing to do)."""
        if self._last is not None:
            self._stop_waiting(self._last)
        self._lease.stop(revoke=False)
        self._alive.stop(revoke=False)
        self._run.close()

    # --- joining a round --------------------------------------------------------------------

    def _join(self, deadline: float, leaving: _Membership | None = None) -> _Membership | None:
        """One attempt to join the current round, in one transaction that also leaves
        ``leaving`` (opening the next round unless another member did) and elects the
        round's sealer; None to try again (the round moved on, this node's lease was
        renewed, or the sealer changed hands). The seal is awaited on the watch of the
        round's control keys that ``leaving`` kept, else on one opened now."""
        taken = leaving.waiting if leaving is not None else None
        if leaving is not None:
            leaving.waiting = None
        if taken is not None and taken.round == self._round_hint:
            control, seen = taken.take()
        else:
            if taken is not None:
                taken.stop()
            control, seen = self._kv.watch(self._keys.ctl(self._round_hint), 0), []
        try:
            control.start()
            return self._join_watching(control, seen, deadline, leaving)
        finally:
            control.cancel()

    def _join_watching(self, control: Watch, seen: list[ops.Event], deadline: float,
                       leaving: _Membership | None) -> _Membership | None:
        """:meth:`_join`, with ``control`` watching the round's control keys (``seen``: the
        changes it brought before)."""
        keys, r, me = self._keys, self._round_hint, self._node
        lease, renewals = self._lease.id, self._lease.renewals
        before = self._leave_ops(leaving) if leaving is not None else [
            ops.txn([ops.absent(keys.round)], [ops.put(keys.round, b"0", self._run.lease_id)])]
        alive = self._alive.id
        result = self._with_lease(lease, [ops.absent(keys.seal(r)), ops.absent(keys.closed)], [
            *before, ops.put(keys.join(r, me), b"", lease), ops.delete(keys.spare(r, me)),
            ops.put(keys.live(r, me), b"", alive),
            ops.txn([ops.absent(keys.sealer(r))], [ops.put(keys.sealer(r), me.encode(), lease)]),
            ops.get(keys.round)], [*before, ops.get(keys.round), ops.get(keys.closed),
                                   ops.get(keys.seal(r)),
                                   ops.get(keys.join(r, me), keys_only=True)], alive=alive)
        if result is None:
            return None
        if not result.succeeded:
            return self._not_joined(r, result)
        if not self._in_current_round(r, result.ranges[0]):
            return None
        self._spare = False
        joined = result.revision
        if result.nested[-1]:
            seal = self._seal(r, deadline, renewals)
        else:
            seal = self._await_seal(r, control, seen, deadline, renewals)
        if seal is None:
            return None
        rank = seal.rank_of(self._join_revision(r, joined, seal))
        if rank is None:
            raise _Late(seal, seal.revision)
        return _Membership(r, rank, seal)

    def _leave_ops(self, leaving: _Membership) -> list[dict]:
        """Leaving round ``leaving.round``: its join key and liveness record go; unless
        another member did, this one opens the next round and tells the members that a
        node wants it."""
        keys, r = self._keys, leaving.round
        return [ops.delete(keys.join(r, self._node)), ops.delete(keys.live(r, self._node)),
                ops.txn([ops.value_is(keys.round, b"%d" % r)],
                        [ops.put(keys.round, b"%d" % (r + 1), self._run.lease_id),
                         ops.put(keys.wanted(r + 1), b"", self._run.lease_id)])]

    def _in_current_round(self, r: int, found: list[ops.KeyValue]) -> bool:
        """Whether round ``r``, just joined, is the current one; if not (the round moved on
        meanwhile) the join is undone and the current round noted."""
        if found and round_number(found[0]) == r:
            return True
        self._undo_join(r)
        self._round_hint = round_number(found[0]) if found else 0
        return False

    def _undo_join(self, r: int) -> None:
        """Takes this node out of round ``r``: its join key, and the sealer's part if held."""
        keys, me = self._keys, self._node
        self._kv.txn([], [ops.delete(keys.join(r, me)), ops.delete(keys.live(r, me)), ops.txn(
            [ops.value_is(keys.sealer(r), me.encode())], [ops.delete(keys.sealer(r))])])

    def _with_lease(self, lease: int, compare: list[dict], success: list[dict],
                    failure: list[dict] | None = None, alive: int | None = None
                    ) -> ops.TxnResult | None:
        """A transaction writing with this node's ``lease`` (and its liveness lease
        ``alive``, if given); None if a lease had expired: the liveness lease if etcd no
        longer refreshes it, else the node's, is renewed, and the caller starts over
        (again, should the other one have expired too)."""
        try:
            return self._kv.txn(compare, success, failure)
        except RendezvousConnectionError as exc:
            if "lease not found" not in str(exc):
                raise
        if alive is not None and self._kv.keep_alive([alive]).get(alive, 0) <= 0:
            self._alive.renew(alive)
        else:
            self._lease.renew(lease)
        return None

    def _not_joined(self, r: int, result: ops.TxnResult) -> _Membership | None:
        """Why a join failed: closed (raises), no round yet (starts round 0), another round
        (follows it), or this one is sealed: with this node in it (it waited for the round
        and was counted before it could join again), else raises _Late."""
        round_kv, closed, seal, mine = result.ranges
        if closed:
            self._raise_closed()
        if not round_kv:
            self._kv.txn([ops.absent(self._keys.round)],
                         [ops.put(self._keys.round, b"0", self._run.lease_id)])
            self._round_hint = 0
        elif round_number(round_kv[0]) != r:
            self._round_hint = round_number(round_kv[0])
        elif seal:
            sealed = Seal.of(seal[0])
            rank = sealed.rank_of(mine[0].create_revision) if mine else None
            if rank is None:
                raise _Late(sealed, result.revision)
            self._spare = False
            return _Membership(r, rank, sealed)
        return None

    def _join_revision(self, r: int, joined: int, seal: Seal) -> int:
        """The create revision of this node's join key: the join's own revision, unless the
        key existed already (this node waited for the round before it opened)."""
        if seal.rank_of(joined) is not None:
            return joined
        found = self._kv.read(ops.get(self._keys.join(r, self._node), keys_only=True)).ranges[0]
        return found[0].create_revision if found else joined

    def _await_seal(self, r: int, watch: Watch, seen: list[ops.Event], deadline: float,
                    renewals: int) -> Seal | None:
        """Waits on ``watch`` (round ``r``'s control keys; ``seen``: what it brought before)
        for the round's seal, claiming the sealer's part if its holder dies."""
        keys, every = self._keys, self._settings.watch_check_interval
        events: list[ops.Event] | None = seen
        checked = time.monotonic()  # when the watch last brought a change, or was checked
        while True:
            for event in events or []:
                key = event.kv.key
                if key == keys.seal(r) and not event.deleted:
                    return Seal.of(event.kv)
                if key == keys.closed_in(r):
                    self._raise_closed()
                if key == keys.sealer(r) and event.deleted and self._claim_sealer(r):
                    return self._seal(r, deadline, renewals)
            try:
                events = self._next(watch, r, deadline, until=checked + every)
                if events or time.monotonic() >= checked + every:
                    events = events or self._missed(r, watch, None, sealer_held=True)
                    checked = time.monotonic()
            except RendezvousConnectionError as exc:
                events = self._missed(r, watch, exc)
            if self._lease.renewals != renewals:
                return None

    def _missed(self, r: int, watch: Watch, why: Exception | None,
                sealer_held: bool = False) -> list[ops.Event]:
        """The changes of round ``r``'s control keys that ``watch`` did not bring, as changes:
        a seal, a close, a waiting node, or the sealer's part free (its key absent) to claim.

        ``why``: the stream broke and cannot resume where it stopped (etcd compacted that
        history, or restarted without it); the watch then watches anew from now, and the
        keys are read once. None: the watch brought nothing for ``watch_check_interval``
        seconds, as an idle stream, or one that died silently (a NAT's or a load
        balancer's idle timeout, a host gone): one read of the keys tells. If they show a
        change the watch did not bring (with ``sealer_held``, also the sealer's key gone),
        its stream is taken for dead and handled as a broken one; else nothing was
        missed. RendezvousConnectionError if etcd cannot be reached."""
        keys = self._keys
        if why is None:
            found = self._kv.read(ops.get(keys.ctl(r), prefix=True)).ranges[0]
            if all(kv.mod_revision < watch.revision for kv in found) and not (
                    sealer_held and all(kv.key != keys.sealer(r) for kv in found)):
                return []
            why = RendezvousConnectionError(
                f"it brought nothing for {self._settings.watch_check_interval:g} s while the "
                "round's control keys changed: its stream died silently")
        log.warning("The watch of rendezvous round %d failed (%s); watching it anew.", r, why)
        watch.restart()
        found = self._kv.read(ops.get(keys.ctl(r), prefix=True)).ranges[0]
        events = [ops.Event(False, kv) for kv in found]
        if all(kv.key != keys.sealer(r) for kv in found):
            events.append(ops.Event(True, ops.KeyValue(keys.sealer(r), b"", 0, 0, 0)))
        return events

    def _claim_sealer(self, r: int) -> bool:
        keys = self._keys
        lease = self._lease.id
        result = self._with_lease(lease, [ops.absent(keys.sealer(r)), ops.absent(keys.seal(r))],
                                  [ops.put(keys.sealer(r), self._node.encode(), lease)])
        return result is not None and result.succeeded

    def _seal(self, r: int, deadline: float, renewals: int) -> Seal | None:
        """As round ``r``'s sealer: :class:`~.etcd_sealer.RoundSealer` seals it, waiting on
        its watch until the join deadline; None if it lost the part (this node's lease was
        renewed since ``renewals``)."""
        return self._sealer.seal(SealerTurn(
            r, lambda watch, until: self._next(watch, r, deadline, until),
            lambda: self._lease.renewals != renewals, self.use_agent_store))

    def _next(self, watch: Watch, r: int, deadline: float,
              until: float | None = None) -> list[ops.Event] | None:
        """The watch's next events, waiting at most until ``until``, the join deadline (then
        this node leaves round ``r`` and RendezvousTimeoutError is raised) or a lease TTL."""
        now = time.monotonic()
        if now >= deadline:
            self._undo_join(r)
            raise RendezvousTimeoutError(
                f"The rendezvous of {self._settings.run_id} did not complete within "
                f"join_timeout={self._settings.join_timeout:g} s.")
        wait = min(deadline, until if until is not None else deadline) - now
        return watch.next(min(wait, self._settings.lease_ttl,
                              self._settings.watch_check_interval))

    # --- between rounds ---------------------------------------------------------------------

    def _leave_if_refused(self, r: int) -> None:
        """This node is outside round ``r``'s seal: NodeLeftError if the sealer's node policy
        left it out (it would be left out of every round), else nothing (it came late)."""
        found = self._kv.read(ops.get(self._keys.refused(r, self._node))).ranges[0]
        if found:
            raise NodeLeftError(name_of(self._node), "not admitted by the sealer of round "
                                f"{r}: {found[0].value.decode(errors='replace')}")

    def _wait_for_next_round(self, seal: Seal, revision: int, deadline: float) -> None:
        """This node came after round ``r`` was sealed: it waits for round r+1, counted by the
        members as waiting (so they re-rendezvous to take it in), or as an uncounted spare
        if round r already has ``max_nodes``. Should every member of round r be gone, it
        opens round r+1 itself. A spare waits as long as the job runs, as torch's
        redundancy list does: ``deadline`` (the join timeout) bounds only a counted wait."""
        keys, r = self._keys, self._round_hint
        self._spare = seal.world_size >= self._settings.max_nodes
        lease = self._lease.id
        waits = [ops.put(keys.spare(r + 1, self._node), b"", lease)] if self._spare else [
            ops.put(keys.join(r + 1, self._node), b"", lease),
            ops.put(keys.wanted(r + 1), b"", self._run.lease_id)]
        waits.append(ops.delete(keys.live(r, self._node)))  # no member of round r
        if self._with_lease(lease, [], waits) is None:
            return
        watch = self._kv.watch(keys.run, revision + 1)
        if self._spare:
            deadline = math.inf
        try:
            while True:
                try:
                    events = self._next(watch, r + 1, deadline)
                except RendezvousConnectionError as exc:  # cannot resume: see _missed
                    log.warning("The watch of the rendezvous' current round broke and cannot "
                                "resume (%s); watching it anew.", exc)
                    watch.restart()
                    events = None  # what it missed: read below
                if events is None and not self._members_alive(r):
                    self._kv.txn([ops.value_is(keys.round, b"%d" % r)],
                                 [ops.put(keys.round, b"%d" % (r + 1), self._run.lease_id)])
                for event in events or []:
                    if event.kv.key == keys.closed:
                        self._raise_closed()
                    if event.kv.key == keys.round and not event.deleted:
                        self._round_hint = round_number(event.kv)
                        return
                if events is None and self._round_moved(r):
                    return
        finally:
            watch.cancel()

    def _members_alive(self, r: int) -> bool:
        """Whether any member of round ``r`` still holds its join key (its lease lives)."""
        found = self._kv.read(ops.get(self._keys.joins(r), prefix=True, keys_only=True))
        return any(ours(kv) for kv in found.ranges[0])

    def _round_moved(self, r: int) -> bool:
        """Whether the current round is no longer ``r`` (read, in case the watch of it
        missed the change); raises if the rendezvous closed."""
        found, closed = self._kv.read(ops.get(self._keys.round),
                                      ops.get(self._keys.closed)).ranges
        if closed:
            self._raise_closed()
        if found and round_number(found[0]) != r:
            self._round_hint = round_number(found[0])
            return True
        return False

    def _info(self, membership: _Membership) -> RendezvousInfo:
        """What torch's agent gets: the round's store (prefixed as torch's handler does),
        this node's rank, the world size and the workers' bootstrap store."""
        seal, settings = membership.seal, self._settings
        if membership.rank == 0:
            membership.server = self._sealer.take_store()
        store = dist.PrefixStore(f"torch.rendezvous.{settings.run_id}.{membership.round}",
                                 self._store)
        self._last = membership
        self._round_hint = membership.round
        return RendezvousInfo(store, membership.rank, seal.world_size,
                              RendezvousStoreInfo(seal.addr, seal.bootstrap_port))

    def _stop_waiting(self, membership: _Membership) -> None:
        if membership.waiting is not None:
            membership.waiting.stop()
            membership.waiting = None

    def _count_out(self, last: _Membership | None) -> None:
        """Counts this node out of the job (``last``: its last round; None: it never was
        a member, e.g. a spare the job did not need); the last node out deletes every
        key of the run (else they expire with the run's lease). Not while a node that
        did not count itself out still holds a join or spare key in that round or the
        next (a member still running, or a node waiting for a round): a waiting node
        must find the close, which a watch that died silently would otherwise never
        bring it, and counts itself out when it leaves."""
        keys = self._keys
        r = last.round if last is not None else self._round_hint
        try:
            result = self._kv.txn([], [
                ops.put(keys.left + self._node.encode(), b"", self._run.lease_id),
                ops.get(keys.left, prefix=True, keys_only=True),
                *(ops.get(prefix, prefix=True, keys_only=True)
                  for prefix in (keys.joins(r), keys.joins(r + 1), keys.spares(r + 1)))])
            left, *rounds = result.ranges
            gone = {kv.key[len(keys.left):] for kv in left if ours(kv)}
            present = {kv.key.rsplit(b"/", 1)[-1] for found in rounds for kv in found
                       if ours(kv)} - gone
            if not present and (last is None or len(gone) >= last.seal.world_size):
                self._run.delete_all()
        except RendezvousError as exc:
            log.warning("Could not delete the run's etcd keys (%s); they expire with their "
                        "lease.", exc)

    def _raise_closed(self) -> None:
        if self._spare:
            raise RendezvousGracefulExitError(
                f"The rendezvous of {self._settings.run_id} closed while this node was a spare.")
        raise closed_error(self._settings.run_id)


def create_handler(params: RendezvousParameters) -> EtcdNativeHandler:
    """The factory torch's handler registry gets (see
    :func:`elastic_train.agent.rendezvous.register`)."""
    return EtcdNativeHandler(params)
