"""A worker's connections must close when it dies, even while a process it forked (a
DataLoader worker) lives on: else its peers' collectives wait for that process."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.support.paths import REPO

WORKER = """
import os, socket, sys, time
from elastic_train.worker.inprocess import group_sockets

with group_sockets.recording():   # a launched script's main: one block
    group = socket.create_connection(("127.0.0.1", int(sys.argv[1])))   # its process group
    if os.fork() == 0:            # a DataLoader worker, forked inside the block
        time.sleep(30)
        os._exit(0)
    print("forked", flush=True)
    time.sleep(60)
"""


@pytest.mark.e2e
@pytest.mark.timeout(60)
def test_a_peer_sees_the_connection_close_when_the_worker_dies_though_its_child_lives():
    with socket.create_server(("127.0.0.1", 0)) as server:
        worker = subprocess.Popen([sys.executable, "-c", WORKER, str(server.getsockname()[1])],
                                  cwd=REPO, stdout=subprocess.PIPE, text=True,
                                  start_new_session=True)
        try:
            peer, _ = server.accept()
            assert worker.stdout.readline().strip() == "forked"
            peer.settimeout(20)
            os.kill(worker.pid, signal.SIGKILL)
            started = time.monotonic()
            assert peer.recv(1) == b""  # closed, as a dead peer's gloo pair reads it
            assert time.monotonic() - started < 2  # before: when the child ended (30 s)
            peer.close()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.pid, signal.SIGKILL)  # the worker and its child
            worker.wait()
