"""An etcd that cannot be reached: each call of our etcd client waits it out for at most
``outage_timeout`` seconds of wall-clock time, whatever the connect timeout, and its
connections keep TCP alive (see ``elastic_train.agent.rendezvous.etcd_outage``).

Real sockets: a port that drops connection attempts (:class:`Blackhole`), the session's
etcd behind a proxy.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from torch.distributed.elastic.rendezvous import (
    RendezvousConnectionError,
    RendezvousParameters,
)

from tests.support.servers import Blackhole, TcpProxy

pytest.importorskip("etcd3gw", reason="etcd3gw is not installed (pip install etcd3gw)")

from elastic_train.agent.rendezvous import etcd_kv as ops  # noqa: E402
from elastic_train.agent.rendezvous.etcd_outage import KEEPALIVE_IDLE_S  # noqa: E402
from elastic_train.agent.rendezvous.etcd_v3 import create_client  # noqa: E402

pytestmark = pytest.mark.timeout(60)
TIMEOUT_S, OUTAGE_S = 2, 4  # per attempt to connect; for the whole call


def _client(port: int):
    return create_client(RendezvousParameters("etcd", f"127.0.0.1:{port}", "outage", 1, 1,
                                              timeout=TIMEOUT_S, outage_timeout=OUTAGE_S))


def _seconds_to_fail(call) -> float:
    began = time.monotonic()
    with pytest.raises(RendezvousConnectionError):
        call()
    return time.monotonic() - began


@pytest.fixture
def hole() -> Iterator[Blackhole]:
    made = Blackhole()
    yield made
    made.close()


def test_a_call_to_a_host_that_drops_packets_gives_up_after_outage_timeout(hole) -> None:
    """Through requests (the session's adapter): asking etcd its version. Each attempt
    used to wait the whole connect timeout, attempts counted by outage_timeout: 18.5 s."""
    took = _seconds_to_fail(lambda: ops.EtcdKV(_client(hole.port)))
    assert OUTAGE_S - 0.5 <= took <= OUTAGE_S + 1.0, took


def test_a_transaction_whose_etcd_went_dark_gives_up_after_outage_timeout(
        etcd_endpoint) -> None:
    """Through the session's own pool (``_Direct``): etcd answers, then its address drops
    every packet (the proxy's port is a black hole)."""
    proxy = TcpProxy(int(etcd_endpoint.rsplit(":", 1)[1]))
    try:
        kv = ops.EtcdKV(_client(proxy.port))
        kv.txn([], [ops.put(b"/outage-test", b"1")])
    finally:
        proxy.cut()
    hole = Blackhole(proxy.port)
    try:
        took = _seconds_to_fail(lambda: kv.txn([], [ops.put(b"/outage-test", b"2")]))
        assert OUTAGE_S - 0.5 <= took <= OUTAGE_S + 1.0, took
    finally:
        hole.close()


def test_connections_to_etcd_keep_tcp_alive(etcd_endpoint) -> None:
    """A NAT or load balancer forgets a flow left idle (pooled connections are, between
    bursts; a watch stream while nothing changes): TCP keep-alive keeps the flow known,
    and finds it dead if the far end is gone, before a transaction is sent on it."""
    kv = ops.EtcdKV(_client(int(etcd_endpoint.rsplit(":", 1)[1])))
    kv.txn([], [ops.put(b"/outage-test", b"1")])
    pooled = [conn.sock for conn in list(kv._direct._pool.pool.queue)
              if conn is not None and conn.sock is not None]
    assert pooled
    for sock in pooled:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == KEEPALIVE_IDLE_S
