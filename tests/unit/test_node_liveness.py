"""Which nodes of a round are known gone: real beacons (sockets) probed through a real torch
store, and the waits that stop for a node known gone."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from torch.distributed import HashStore

from elastic_train.agent.attribution import FailureExchange, NodeReport, charged
from elastic_train.agent.inprocess import attempt_store
from elastic_train.agent.node_liveness import Beacon, NodeLiveness, answers, probe
from elastic_train.errors import WorkerFailure


@pytest.fixture
def beacons():
    made = [Beacon("127.0.0.1") for _ in range(3)]
    yield made
    for beacon in made:
        beacon.close()


def _published(beacons) -> tuple[HashStore, list[NodeLiveness]]:
    store = HashStore()
    nodes = [NodeLiveness(store, rank, len(beacons), beacon)
             for rank, beacon in enumerate(beacons)]
    for node in nodes:
        node.publish()
    return store, nodes


def test_a_live_agent_answers_and_a_closed_one_is_gone_at_once(beacons):
    _, nodes = _published(beacons)
    assert nodes[0].gone() == set()
    beacons[2].close()
    started = time.monotonic()
    assert nodes[0].gone() == {2} and nodes[1].gone([2]) == {2}
    assert time.monotonic() - started < 0.5  # refused: no timeout waited
    assert nodes[0].gone([1]) == set()  # only the ranks asked about


def test_a_killed_agent_process_is_gone(tmp_path):
    """A real process holding a beacon, SIGKILLed: the kernel closes its socket."""
    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from elastic_train.agent.node_liveness import Beacon\n"
        "print(Beacon('127.0.0.1').address, flush=True)\n"
        "time.sleep(600)\n")], stdout=subprocess.PIPE, text=True)
    try:
        address = child.stdout.readline().strip()
        assert probe(address) is False
        child.kill()
        child.wait(10)
        assert probe(address) is True
    finally:
        child.kill()
        child.wait()


def test_another_process_on_the_port_is_not_the_agent(beacons):
    """A port the dead agent held, taken by something else: the token tells."""
    host, port, _ = beacons[0].address.rsplit(":", 2)
    assert probe(f"{host}:{port}:{'0' * 32}") is True


def test_a_silent_listener_is_slow_not_gone():
    """Connected, but nothing answers (a stopped agent's socket still accepts): alive."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        address = f"127.0.0.1:{sock.getsockname()[1]}:{'a' * 32}"
        assert probe(address, timeout_s=0.2) is False
        assert answers(address, timeout_s=0.2) is False  # the strict question: no token


def test_only_the_beacon_itself_answers(beacons):
    """:func:`answers` (is the recording driver there?): its token, nothing else."""
    host, port, _ = beacons[0].address.rsplit(":", 2)
    assert answers(beacons[0].address, timeout_s=1) is True
    assert answers(f"{host}:{port}:{'0' * 32}", timeout_s=1) is False
    beacons[0].close()
    assert answers(beacons[0].address, timeout_s=1) is False


def test_a_node_that_has_not_published_is_not_known_gone(beacons):
    store = HashStore()
    liveness = NodeLiveness(store, 0, 3, beacons[0])
    assert liveness.gone() == set()


def test_gone_stays_gone_for_the_round(beacons):
    _, nodes = _published(beacons)
    beacons[1].close()
    assert nodes[0].gone() == {1}
    beacons[1] = Beacon("127.0.0.1")  # a new agent elsewhere: the round still lost node 1
    assert nodes[0].gone() == {1}


def _report(rank: int) -> NodeReport:
    root = WorkerFailure(rank=rank, local_rank=0, pid=1, exitcode=1,
                         message="RuntimeError: Connection reset by peer", traceback=None)
    return NodeReport(rank, own=False, first=float(rank + 1), root=root)


def test_the_failure_exchange_stops_waiting_for_a_node_known_gone(beacons):
    store, nodes = _published(beacons)
    beacons[2].close()
    exchange = FailureExchange(store, "g", wait_s=30)
    FailureExchange(store, "g").share(_report(1), nodes=1)  # node 1 told (alone)
    started = time.monotonic()
    others = exchange.share(_report(0), nodes=3, gone=nodes[0].gone)
    assert time.monotonic() - started < 1.0
    assert [o.group_rank for o in others] == [1]
    assert charged(_report(0), others, nodes=3, lost=nodes[0].gone()) is None


def test_a_survivor_is_not_charged_even_when_all_the_others_told():
    """Every survivor told, and this one raised first: the loss of node 2 is still no
    survivor's fault."""
    mine, other = _report(0), _report(1)
    assert charged(mine, [other], nodes=2) is mine  # without a loss: the first raise pays
    assert charged(mine, [other], nodes=3, lost={2}) is None
    own = NodeReport(0, own=True, first=1.0, root=mine.root)
    assert charged(own, [other], nodes=3, lost={2}) is own  # a local death still is its own


def _group(store: HashStore, nodes: int) -> SimpleNamespace:
    return SimpleNamespace(store=store, group_world_size=nodes)


def test_the_in_process_barrier_stops_for_a_node_known_gone():
    group = _group(HashStore(), 3)
    started = time.monotonic()
    assert attempt_store.all_ready(group, 0, 30.0, lambda: False, gone=lambda: {2}) is False
    assert time.monotonic() - started < 1.0
    assert attempt_store.all_ready(group, 0, 0.3, lambda: False) is False  # as before: timeout


def test_a_node_known_gone_failed_by_itself_elsewhere():
    group = _group(HashStore(), 3)
    started = time.monotonic()
    assert attempt_store.failed_by_itself_elsewhere(group, 0, 30.0, gone=lambda: {1})
    assert time.monotonic() - started < 1.0
    assert not attempt_store.failed_by_itself_elsewhere(group, 0, 0.1)
