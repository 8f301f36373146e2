"""Our native etcd rendezvous handler (``--rdzv-backend etcd``) against a real etcd server:
torch's RendezvousHandler behaviour -- ranks and world size, the round's store,
min/max nodes and the last call, waiting nodes and spares, a lost node, closing,
timeouts -- with handlers in threads of this process, as nodes.

Skipped when the ``etcd`` binary (Debian: etcd-server) or ``etcd3gw`` is missing.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousGracefulExitError,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousTimeoutError,
)
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

from tests.conftest import wait_until
from tests.support.etcd_server import EtcdServer, TLSFiles, run_keys
from tests.support.servers import TcpProxy

pytest.importorskip("etcd3gw", reason="etcd3gw is not installed (pip install etcd3gw)")

from elastic_train._internal.rendezvous_backends import lookup  # noqa: E402
from elastic_train.agent.rendezvous import etcd_kv as ops  # noqa: E402
from elastic_train.agent.rendezvous.etcd_native import EtcdNativeHandler  # noqa: E402
from elastic_train.agent.rendezvous.registry import register  # noqa: E402

pytestmark = pytest.mark.timeout(90)


class Nodes:
    """Handlers of one run, each standing for a node; all shut down at the end."""

    def __init__(self, endpoint: str, min_nodes: int, max_nodes: int, **conf: object) -> None:
        self.endpoint, self.run_id = endpoint, f"native-{uuid.uuid4().hex[:8]}"
        self.min_nodes, self.max_nodes = min_nodes, max_nodes
        self.conf = {"last_call_timeout": 1, "join_timeout": 30, **conf}
        self.handlers: list[EtcdNativeHandler] = []

    def add(self, count: int = 1) -> list[EtcdNativeHandler]:
        register(lookup("etcd", "test"))
        made = [get_rendezvous_handler(RendezvousParameters(
            "etcd", self.endpoint, self.run_id, self.min_nodes, self.max_nodes,
            local_addr="127.0.0.1", **self.conf)) for _ in range(count)]
        self.handlers += made
        return made

    def close(self) -> None:
        for handler in self.handlers:
            if handler._lease is not None:
                handler.shutdown()


class Joins:
    """next_rendezvous() of several handlers in threads; results and errors by handler."""

    def __init__(self, handlers: list[EtcdNativeHandler]) -> None:
        self.infos: dict[int, RendezvousInfo] = {}
        self.errors: dict[int, BaseException] = {}
        self.threads = [threading.Thread(target=self._join, args=(i, h), daemon=True)
                        for i, h in enumerate(handlers)]
        for thread in self.threads:
            thread.start()

    def _join(self, i: int, handler: EtcdNativeHandler) -> None:
        try:
            self.infos[i] = handler.next_rendezvous()
        except BaseException as exc:  # checked by the tests
            self.errors[i] = exc

    def wait(self, timeout: float = 30) -> Joins:
        for thread in self.threads:
            thread.join(timeout)
        assert not any(t.is_alive() for t in self.threads), "a join did not return"
        return self

    def worlds(self) -> set[int]:
        return {info.world_size for info in self.infos.values()}

    def ranks(self) -> list[int]:
        return sorted(info.rank for info in self.infos.values())


@pytest.fixture
def nodes(etcd_endpoint: str) -> Iterator[Callable[..., Nodes]]:
    made: list[Nodes] = []

    def make(min_nodes: int, max_nodes: int, **conf: object) -> Nodes:
        made.append(Nodes(etcd_endpoint, min_nodes, max_nodes, **conf))
        return made[-1]

    yield make
    for run in made:
        run.close()


def lose(handler: EtcdNativeHandler) -> None:
    """The node dies: its leases are no longer refreshed, nothing more is sent."""
    handler.release()
    handler._lease = None  # type: ignore[assignment]


@pytest.mark.parametrize("etcd_major", ["3.4", "3.5"])
def test_nodes_form_a_round_with_ranks_and_a_store(request, etcd_major: str) -> None:
    from tests.support.etcd_server import etcd_binaries

    binary = etcd_binaries().get(etcd_major)
    if binary is None:
        pytest.skip(f"no etcd {etcd_major} here")
    server = EtcdServer(binary)
    server.start()
    run = Nodes(server.endpoint, 3, 3)
    try:
        handlers = run.add(3)
        assert all(h.get_backend() == "etcd" and h.get_run_id() == run.run_id for h in handlers)
        joins = Joins(handlers).wait()
        assert not joins.errors and joins.ranks() == [0, 1, 2] and joins.worlds() == {3}
        infos = list(joins.infos.values())
        infos[0].store.set("hello", b"from a node")
        assert {i.store.get("hello") for i in infos} == {b"from a node"}
        assert len({(i.bootstrap_store_info.master_addr, i.bootstrap_store_info.master_port)
                    for i in infos}) == 1
        assert all(h.num_nodes_waiting() == 0 for h in handlers)
        assert all(h.shutdown() for h in handlers)
        assert run_keys(server.endpoint, run.run_id) == []  # the last one out cleaned up
    finally:
        run.close()
        server.stop()


def test_nodes_form_and_form_again_over_tls_with_client_certificates(etcd_server, tmp_path
                                                                     ) -> None:
    """etcd on HTTPS only, asking each client for a certificate its CA signed: the nodes
    reach it with ``--rdzv-conf protocol=https,ca_cert=...,cert=...,key=...`` for their
    transactions, leases and watches; a node that does not trust etcd's certificate gets
    a connection error before it joins anything."""
    tls = TLSFiles.make(str(tmp_path))
    server = EtcdServer(etcd_server.binary, tls=tls)
    server.start()
    conf = {"protocol": "https", "ca_cert": tls.ca, "cert": tls.client_cert,
            "key": tls.client_key}
    run = Nodes(server.endpoint, 2, 2, **conf)
    try:
        members = run.add(2)
        assert all(h._kv._direct is not None for h in members)  # not through requests
        assert Joins(members).wait().worlds() == {2}
        assert wait_until(lambda: all(h._last.waiting is not None for h in members
                                      if h.num_nodes_waiting() == 0), 10)
        again = Joins(members).wait()  # awaits the seal on the watches kept
        assert not again.errors and again.worlds() == {2} and again.ranks() == [0, 1]
        (tmp_path / "other").mkdir()
        stranger = TLSFiles.make(str(tmp_path / "other"))
        with pytest.raises(RendezvousConnectionError, match="(?i)certificate"):
            Nodes(server.endpoint, 2, 2, **{**conf, "ca_cert": stranger.ca}).add(1)
    finally:
        run.close()
        server.stop()


def test_the_last_call_takes_in_nodes_up_to_max(nodes) -> None:
    run = nodes(2, 3, last_call_timeout=3)
    first = Joins(run.add(2))
    time.sleep(1)  # within the last call, which started when the 2nd (min) node joined
    late = Joins(run.add(1))
    assert first.wait().worlds() == late.wait().worlds() == {3}


def test_min_nodes_after_the_last_call(nodes) -> None:
    run = nodes(2, 4, last_call_timeout=1)
    started = time.monotonic()
    joins = Joins(run.add(2)).wait()
    assert joins.worlds() == {2} and joins.ranks() == [0, 1]
    assert 0.9 <= time.monotonic() - started < 10


def test_a_late_node_waits_and_the_members_take_it_in(nodes) -> None:
    run = nodes(1, 3, last_call_timeout=1)
    members = run.add(2)
    assert Joins(members).wait().worlds() == {2}
    newcomer = Joins(run.add(1))
    assert wait_until(lambda: all(h.num_nodes_waiting() >= 1 for h in members), 15)
    again = Joins(members).wait()  # torch's agent re-rendezvouses when nodes wait
    assert again.worlds() == newcomer.wait().worlds() == {3}
    assert sorted(again.ranks() + newcomer.ranks()) == [0, 1, 2]


def test_a_waiting_node_counted_into_a_round_before_it_joined_it_is_a_member(nodes) -> None:
    """The members re-join and the round fills up (max_nodes) with the waiting node's key
    before that node itself got to join it: it must take its place, not wait as a spare
    of a round it is in (seen with launch: the job hung in rank assignment)."""
    run = nodes(1, 3, last_call_timeout=1)
    members = run.add(2)
    assert Joins(members).wait().worlds() == {2}
    newcomer = run.add(1)[0]
    waits = newcomer._wait_for_next_round

    def slow_to_notice(*args: object) -> None:
        waits(*args)
        time.sleep(1.5)  # the members seal meanwhile

    newcomer._wait_for_next_round = slow_to_notice  # type: ignore[method-assign]
    late = Joins([newcomer])
    assert wait_until(lambda: all(h.num_nodes_waiting() >= 1 for h in members), 15)
    again = Joins(members).wait()
    assert late.wait().worlds() == again.worlds() == {3}
    assert sorted(again.ranks() + late.ranks()) == [0, 1, 2]


def test_a_node_at_a_full_round_is_an_uncounted_spare(nodes) -> None:
    run = nodes(2, 2)
    members = run.add(2)
    assert Joins(members).wait().worlds() == {2}
    spare = Joins(run.add(1))
    time.sleep(2)
    assert [h.num_nodes_waiting() for h in members] == [0, 0]  # no pointless restart
    members[0].set_closed()
    spare.wait()
    assert isinstance(spare.errors[0], RendezvousGracefulExitError)


def test_a_spare_outwaits_the_join_timeout_and_takes_a_lost_nodes_place(nodes) -> None:
    """A spare waits as long as the job runs (torch's redundancy list does too): the join
    timeout bounds forming a round, not standing by. When a member is lost, the spare
    takes its place and the world size is kept."""
    run = nodes(2, 2, join_timeout=2)
    members = run.add(2)
    assert Joins(members).wait().worlds() == {2}
    spare = Joins(run.add(1))
    time.sleep(4)  # twice the join timeout
    assert not spare.errors, spare.errors
    lose(members[1])
    again = Joins([members[0]])
    spare.wait()
    again.wait()
    assert not spare.errors and not again.errors, (spare.errors, again.errors)
    assert spare.worlds() == again.worlds() == {2}


def test_a_lost_node_is_not_waited_for(nodes) -> None:
    """The survivors form the next round after the last call alone: they do not wait for
    the lost node's lease (torch's 5 s x 3 = 15 s) to expire."""
    run = nodes(2, 3, last_call_timeout=1)
    handlers = run.add(3)
    assert Joins(handlers).wait().worlds() == {3}
    lose(handlers[2])
    started = time.monotonic()
    again = Joins(handlers[:2]).wait()
    assert again.worlds() == {2} and again.ranks() == [0, 1]
    assert time.monotonic() - started < 6


def test_the_survivors_seal_once_every_live_member_came(nodes) -> None:
    """A lost node's liveness record is gone within its TTL (etcd's minimum: 2 s with its
    defaults): the survivors seal then, not after the last call (here 30 s)."""
    run = nodes(2, 3, last_call_timeout=30)
    handlers = run.add(3)
    assert Joins(handlers).wait(60).worlds() == {3}  # max_nodes: no last call
    lose(handlers[2])
    started = time.monotonic()
    again = Joins(handlers[:2]).wait(40)
    assert again.worlds() == {2} and again.ranks() == [0, 1]
    assert time.monotonic() - started < 6


def test_survivors_that_know_a_node_gone_drop_its_liveness_record_at_once(nodes) -> None:
    """Their agents probed the lost node's beacon (node liveness): the lowest-ranked
    survivor deletes its liveness record, and the next round is sealed without waiting
    out the record's TTL (here 20 s: the survivors waited that long before, with a 30 s
    last call)."""
    run = nodes(2, 3, last_call_timeout=30, liveness_ttl=20)
    handlers = run.add(3)
    infos = Joins(handlers).wait(60).infos
    assert {info.world_size for info in infos.values()} == {3}
    lost = max(infos, key=lambda i: infos[i].rank)  # never the sealer (rank 0)
    lose(handlers[lost])
    survivors = [h for i, h in enumerate(handlers) if i != lost]
    acted = [thread for h in survivors if (thread := h.forget_gone({infos[lost].rank}))]
    assert len(acted) == 1  # one survivor deletes it, in a thread
    acted[0].join(10)
    started = time.monotonic()
    again = Joins(survivors).wait(40)
    assert again.worlds() == {2} and again.ranks() == [0, 1]
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("expired", ["liveness", "node"])
def test_a_node_whose_lease_expired_joins_with_a_new_one(nodes, expired: str) -> None:
    """The liveness record is written in the join's transaction, under a lease of its
    own: whichever of the node's two leases etcd dropped (a process stalled past its TTL),
    the node joins the next round under a new one, its liveness record with it."""
    run = nodes(2, 2)
    handlers = run.add(2)
    assert Joins(handlers).wait().worlds() == {2}
    stalled = handlers[1]
    lease = stalled._alive if expired == "liveness" else stalled._lease
    old_id = lease.id
    stalled._kv.revoke(old_id)  # as etcd does once the TTL passes without a refresh
    again = Joins(handlers).wait()
    assert again.worlds() == {2} and again.ranks() == [0, 1]
    assert lease.id != old_id  # renewed
    r = stalled._last.round
    record = stalled._kv.read(ops.get(stalled._keys.live(r, stalled._node))).ranges[0]
    assert record and record[0].lease == stalled._alive.id


def test_a_live_member_still_to_come_is_waited_for_until_the_last_call(nodes) -> None:
    """A member of the last round that is alive but has not come yet keeps its liveness
    record: the others wait for it, at most the last call."""
    run = nodes(2, 3, last_call_timeout=4)
    handlers = run.add(3)
    assert Joins(handlers).wait().worlds() == {3}
    started = time.monotonic()
    again = Joins(handlers[:2]).wait(40)
    assert again.worlds() == {2} and time.monotonic() - started >= 3.9


def test_a_dead_sealer_is_replaced(nodes) -> None:
    """The first joiner seals the round; it dies before it could, and another takes over."""
    run = nodes(2, 3, last_call_timeout=1)
    first = run.add(1)[0]
    doomed = Joins([first])
    assert wait_until(lambda: first._kv.read(ops.get(first._keys.sealer(0))).ranges[0], 10)
    first._lease.stop(revoke=True)  # its keys vanish at once, as when its lease expires
    members = run.add(2)
    others = Joins(members).wait()
    assert others.worlds() == {2} and others.ranks() == [0, 1]
    # Both members, the new sealer and the other, learn of a node that waits for the next
    # round (on the watch each opened before its join).
    newcomer = Joins(run.add(1))
    assert wait_until(lambda: all(h.num_nodes_waiting() >= 1 for h in members), 15)
    first.set_closed()
    doomed.wait()
    newcomer.wait()
    run.handlers.remove(first)


def _break(watch: ops.Watch) -> None:
    """Ends the watch's stream as a network fault or an etcd restart would (it is not
    cancelled: the watch opens it again where it stopped)."""
    raw = watch._response.raw  # type: ignore[union-attr]
    connection = getattr(raw, "_connection", None) or getattr(raw, "connection", None)
    connection.sock.shutdown(socket.SHUT_RDWR)


def test_a_member_whose_watch_of_the_next_round_cannot_resume_still_gets_its_seal(
        nodes) -> None:
    """The members watch the next round's control keys while they train, and await its
    seal on that watch. Should its stream break after etcd compacted the history it was
    to resume from, the member watches anew from now and reads the round's control keys
    once, rather than failing its rendezvous."""
    run = nodes(2, 2, last_call_timeout=1)
    members = run.add(2)
    assert Joins(members).wait().worlds() == {2}
    assert _watching_the_next_round(members)
    _compact(members[0]._kv)
    for handler in members:
        _break(handler._last.waiting._watch)
    again = Joins(members).wait()
    assert not again.errors and again.worlds() == {2} and again.ranks() == [0, 1]


def _compact(kv: ops.EtcdKV) -> None:
    """Writes a little history and has etcd compact it, past every watch's start revision."""
    for i in range(3):
        kv.txn([], [ops.put(b"/compaction-test/%d" % i, b"")])
    revision = kv.read(ops.get(b"/compaction-test/0")).revision
    kv.client.post(kv.client.get_url("/kv/compaction"), json={"revision": str(revision),
                                                               "physical": True})


def _watching_the_next_round(members: list[EtcdNativeHandler]) -> bool:
    """Whether each member watches the round after its last (opened on its first
    num_nodes_waiting() call, as an agent's monitor makes, and created by etcd)."""
    return wait_until(lambda: all(h.num_nodes_waiting() == 0 and h._last.waiting is not None
                                  and h._last.waiting._watch._created.is_set()
                                  for h in members), 10)


@pytest.mark.timeout(120)
def test_members_count_a_waiting_node_after_etcd_compacted_and_restarted(etcd_server) -> None:
    """etcd compacts past where the members' watches of the next round would resume, then
    restarts, breaking their streams: each member watches anew from now and reads the
    round's control keys once, so a node that waits for the next round is counted and
    taken in (it was never counted: the watch retried its compacted revision for ever)."""
    server = EtcdServer(etcd_server.binary)
    server.start()
    run = Nodes(server.endpoint, 1, 3, join_timeout=60)
    try:
        members = run.add(2)
        assert Joins(members).wait().worlds() == {2}
        assert _watching_the_next_round(members)
        _compact(members[0]._kv)
        server.kill()
        server.start()
        newcomer = Joins(run.add(1))
        assert wait_until(lambda: all(h.num_nodes_waiting() >= 1 for h in members), 20)
        again = Joins(members).wait()
        assert again.worlds() == newcomer.wait().worlds() == {3}
        assert sorted(again.ranks() + newcomer.ranks()) == [0, 1, 2]
    finally:
        run.close()
        server.stop()


@pytest.fixture
def forgotten(etcd_endpoint: str) -> Iterator[Callable[[int, int], tuple[Nodes, list]]]:
    """Makes a run of ``min_nodes``-``max_nodes`` whose two members formed through a proxy
    to the session's etcd, which then forgot the flows of their watches of the next round
    (a NAT's idle timeout: no reset, nothing forwarded again): (run, members)."""
    proxy = TcpProxy(int(etcd_endpoint.rsplit(":", 1)[1]))
    made: list[Nodes] = []

    def make(min_nodes: int, max_nodes: int) -> tuple[Nodes, list[EtcdNativeHandler]]:
        made.append(Nodes(f"127.0.0.1:{proxy.port}", min_nodes, max_nodes,
                          watch_check_interval=1, join_timeout=20))
        members = made[-1].add(2)
        assert Joins(members).wait().worlds() == {2}
        assert _watching_the_next_round(members)
        assert proxy.forget("/v3/watch") == 2
        return made[-1], members

    yield make
    for run in made:
        run.close()
    proxy.cut()


def test_a_member_whose_idle_watch_died_silently_still_gets_its_seal(forgotten) -> None:
    """A member awaits the next round's seal on the watch it kept, idle since its last
    rendezvous. Should that flow have died without a reset, a check after
    watch_check_interval seconds without a change (one read) finds the seal the watch
    did not bring: the round forms at once, not after the join timeout."""
    _, members = forgotten(2, 2)
    began = time.monotonic()
    again = Joins(members).wait()
    assert not again.errors and again.worlds() == {2} and again.ranks() == [0, 1]
    assert time.monotonic() - began < 8


def test_members_count_a_waiting_node_though_their_watches_died_silently(forgotten) -> None:
    """The members' watches of the next round die without a reset while they train;
    within seconds of a newcomer's wait, their checks (one read each per
    watch_check_interval seconds without a change) count it, and they take it in."""
    run, members = forgotten(1, 3)
    newcomer = Joins(run.add(1))
    assert wait_until(lambda: all(h.num_nodes_waiting() >= 1 for h in members), 5)
    again = Joins(members).wait()
    assert again.worlds() == newcomer.wait().worlds() == {3}


def test_closing(nodes) -> None:
    run = nodes(2, 2)
    handlers = run.add(2)
    Joins(handlers).wait()
    assert not handlers[1].is_closed()
    handlers[0].set_closed()
    assert handlers[1].is_closed()
    joins = Joins([handlers[1]]).wait()
    assert isinstance(joins.errors[0], RendezvousClosedError)
    late = Joins(run.add(1)).wait()
    assert isinstance(late.errors[0], RendezvousClosedError)
    assert all(h.shutdown() for h in handlers)


def test_a_waiting_node_sees_the_close(nodes) -> None:
    run = nodes(3, 3)
    waiting = Joins(run.add(2))
    time.sleep(1)
    run.add(1)[0].set_closed()
    waiting.wait()
    assert all(isinstance(e, RendezvousClosedError) for e in waiting.errors.values())
    assert len(waiting.errors) == 2


def test_the_join_timeout(nodes) -> None:
    run = nodes(2, 2, join_timeout=2)
    handler = run.add(1)[0]
    started = time.monotonic()
    with pytest.raises(RendezvousTimeoutError):
        handler.next_rendezvous()
    assert 1.5 <= time.monotonic() - started < 10
    # The node left the round it waited in: a later pair forms without it.
    assert Joins(run.add(2)).wait().worlds() == {2}


def _stray(handler: EtcdNativeHandler, key: bytes) -> None:
    """A key of the run written by someone else, without a lease (``etcdctl put``): real
    keys of a node or of the run always carry one."""
    handler._kv.txn([], [ops.put(key, b"")])


def test_a_stray_join_key_is_no_member(nodes) -> None:
    """Was: a join key without a lease counted as a node, so a round of max 2 was sealed
    at once with a member that never comes (the job would wait for it)."""
    run = nodes(1, 2, last_call_timeout=1)
    [handler] = run.add(1)
    _stray(handler, handler._keys.join(0, "ghost_1_2"))
    joins = Joins([handler]).wait()
    assert not joins.errors and joins.worlds() == {1}


def test_a_stray_left_key_does_not_end_the_run_for_the_others(nodes) -> None:
    """Was: the last node out deletes the run's keys once as many nodes as the round had
    counted themselves out; a stray ``left/`` key made the first one out do it while the
    other still ran."""
    run = nodes(2, 2)
    members = run.add(2)
    assert Joins(members).wait().worlds() == {2}
    _stray(members[0], members[0]._keys.left + b"ghost_1_2")
    assert members[0].shutdown()
    assert run_keys(run.endpoint, run.run_id) != []  # still running
    assert members[1].shutdown()
    assert run_keys(run.endpoint, run.run_id) == []


def test_a_node_waiting_on_a_dead_watch_sees_the_close_of_a_run_that_ended_without_it(
        etcd_endpoint: str) -> None:
    """Was: a member alone in its round finished the job and, the last one out, deleted
    every key of the run, its close with them. A newcomer whose watch had died silently
    (etcd stalled, a NAT forgot the flow) then read a run without a round and without a
    close, and waited for a round that never came until its join timeout (the chaos
    suite's etcd_silent trial #173 of seed 2914: 180 s). A waiting node keeps the keys
    alive: it finds the close at its next check and leaves at once."""
    proxy = TcpProxy(int(etcd_endpoint.rsplit(":", 1)[1]))
    run = Nodes(f"127.0.0.1:{proxy.port}", 1, 3, watch_check_interval=1, join_timeout=20)
    try:
        member = run.add(1)
        assert Joins(member).wait().worlds() == {1}
        newcomer = Joins(run.add(1))
        assert wait_until(lambda: member[0].num_nodes_waiting() >= 1, 15)
        assert proxy.forget("/v3/watch") >= 1  # the newcomer's watch of the run, among them
        began = time.monotonic()
        assert member[0].shutdown()  # the job finished without the newcomer
        newcomer.wait(timeout=30)
        assert isinstance(newcomer.errors.get(0), RendezvousClosedError), newcomer.errors
        assert time.monotonic() - began < 8
        assert run_keys(run.endpoint, run.run_id) != []  # kept for the newcomer (its lease)
    finally:
        run.close()
        proxy.cut()
