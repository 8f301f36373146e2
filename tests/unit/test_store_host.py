"""Whether this process hosts the job's rendezvous store (agent/rendezvous/store_host.py):
a socket of its own listening on the endpoint's port, not another process's, and only
for a backend whose endpoint is a node's store (c10d)."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from elastic_train.agent.rendezvous.store_host import hosts_store, listens_on
from elastic_train.rendezvous_config import RendezvousConfig

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")


def test_a_port_this_process_listens_on_is_hosted_here():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        port = server.getsockname()[1]
        assert not listens_on(port)  # bound, not listening yet
        server.listen()
        assert listens_on(port)
        c10d = RendezvousConfig(backend="c10d", endpoint=f"127.0.0.1:{port}", run_id="j")
        assert hosts_store(c10d)
        etcd = RendezvousConfig(backend="etcd", endpoint=f"127.0.0.1:{port}", run_id="j")
        assert not hosts_store(etcd)  # etcd's server is nobody's node
        with socket.create_connection(("127.0.0.1", port)):  # a client socket: not a host
            assert listens_on(port)


def test_a_port_another_process_listens_on_is_not_hosted_here():
    child = subprocess.Popen(
        [sys.executable, "-c", "import socket, sys; s = socket.socket(); "
         "s.bind(('127.0.0.1', 0)); s.listen(); print(s.getsockname()[1], flush=True); "
         "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(child.stdout.readline())
        assert not listens_on(port)
        assert not hosts_store(RendezvousConfig(backend="c10d", endpoint=f"127.0.0.1:{port}",
                                                run_id="j"))
    finally:
        child.stdin.close()
        child.wait(10)
