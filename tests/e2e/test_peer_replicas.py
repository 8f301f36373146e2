"""Peer replicas with real nodes: two ``fit()`` drivers (one worker each, etcd rendezvous)
on moto's S3, their replica servers on TLS (``replica_cert=...`` in the rendezvous
conf), each node through a proxy of its own that records its requests
(:func:`tests.support.peer_faults.run_two_nodes`). Node 1's worker wipes its node's local
tier and raises; the restart restores node 1's share (its ballast file, whose name has
a space) and the model file from node 0's replica server, or, when node 0's copies
were corrupted, from the store; the node's replica key is in no file of the run and
no line of a log. A node whose driver is SIGKILLed is replaced by a new driver, which
restores from the survivor. Each run ends bit-identical to an uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse

import pytest

from tests.conftest import EPOCHS, make_storage, wait_until
from tests.support.etcd_server import TLSFiles
from tests.support.paths import REPO
from tests.support.peer_faults import NODE_ENDPOINT, TwoNodes, data_gets, run_two_nodes
from tests.support.servers import TcpProxy, stop_process

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240),
              pytest.mark.usefixtures("no_leaked_processes")]

BALLAST = "my ballast.bin"  # a name the replica port's URLs quote


def run_with_wiped_node(tmp_path, s3_endpoint, etcd_endpoint, peer: str,
                        baseline) -> TwoNodes:
    """Node 1 wipes its tier at epoch 2 (and does ``peer`` to its peers' copies)."""
    storage = make_storage("s3", tmp_path, s3_endpoint)
    tls = TLSFiles.make(str(tmp_path))  # one certificate for 127.0.0.1 serves both nodes
    ran = run_two_nodes(
        storage, tmp_path, {"backend": "etcd", "endpoint": etcd_endpoint, "conf": {
            "replica_cert": tls.server_cert, "replica_key": tls.server_key,
            "replica_ca_cert": tls.ca}},
        {"how": "wipe_tier", "peer": peer, "rank": 1, "epoch": 2, "batch": 0,
         "marker": str(tmp_path / "wiped")},
        name="peers", epochs=EPOCHS, checkpoint={"peer_replicas": 1},
        train={"ballast_mb": 1, "upload_mode": "SYNC", "ballast_name": BALLAST})
    assert ran.codes == [0, 0], [log[-3000:] for log in ran.logs]
    assert ran.digest == baseline.return_value["digest"]  # bit-identical
    starts = (tmp_path / "out" / "starts").read_text().split()
    assert starts[0] == "0" and int(starts[-1]) == 2, starts  # resumed at epoch 2
    assert any(name.endswith(f"checkpoint_000001/{BALLAST}") for name in ran.held), ran.held
    # The node's replica key is in no file of the run directory and no line of a log.
    key = json.loads((tmp_path / "out" / "wiped.json").read_text())["key"]
    run_files = storage.fs.find(f"{storage.url}/peers")
    assert run_files and not [p for p in run_files if key.encode() in storage.fs.cat_file(p)]
    assert not [log for log in ran.logs if key in log]
    return ran


def test_a_wiped_node_restores_its_share_from_its_peer_not_the_store(
        tmp_path, s3_endpoint, etcd_endpoint, baseline):
    ran = run_with_wiped_node(tmp_path, s3_endpoint, etcd_endpoint, "keep", baseline)
    assert ran.store_reads == []  # 0 bytes of checkpoint files from the store


@pytest.mark.long  # ~25 s; the fallback is also in the unit tests and the chaos suite
def test_a_corrupted_copy_on_the_peer_falls_back_to_the_store(
        tmp_path, s3_endpoint, etcd_endpoint, baseline):
    ran = run_with_wiped_node(tmp_path, s3_endpoint, etcd_endpoint, "corrupt", baseline)
    assert any(p.endswith(f"/checkpoint_000001/{urllib.parse.quote(BALLAST)}")
               for p in ran.store_reads), ran


def _driver(settings: dict, endpoint: int, log) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.scripts.node_driver", json.dumps(settings)], cwd=REPO,
        env={**os.environ, NODE_ENDPOINT: f"http://127.0.0.1:{endpoint}"}, stdout=log,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)


@pytest.mark.long  # ~65 s here
@pytest.mark.timeout(300)
def test_a_replacement_node_restores_its_share_from_the_survivor(
        tmp_path, s3_endpoint, etcd_endpoint, baseline):
    """Node 1's driver is SIGKILLed (with its workers and its disk's tier) once checkpoint 1
    is committed; a new driver takes its place, and the job of two nodes goes on. The
    new node reads no checkpoint file from S3: its share (rank 1's ballast) and the
    model file come from node 0."""
    storage = make_storage("s3", tmp_path, s3_endpoint)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    target = int(s3_endpoint.rsplit(":", 1)[1])
    proxies = [TcpProxy(target), TcpProxy(target)]
    settings = {"storage": storage.url, "storage_options": storage.options, "name": "replaced",
                "out_dir": str(out_dir), "epochs": EPOCHS, "max_failures": 1,
                "step_sleep": 0.3, "rendezvous": {"backend": "etcd", "endpoint": etcd_endpoint},
                "nodes": [2, 2], "checkpoint": {"peer_replicas": 1},
                "train": {"ballast_mb": 1, "upload_mode": "SYNC"}}
    logs = [open(tmp_path / f"node{i}.log", "w") for i in range(3)]  # noqa: SIM115
    procs = [_driver(settings, proxies[i].port, logs[i]) for i in (0, 1)]
    try:
        marker = f"{storage.url}/replaced/checkpoint_000001/.commit.json"
        assert wait_until(lambda: storage.fs.invalidate_cache() or storage.fs.exists(marker),
                          150), "no checkpoint committed"
        rank0 = int((out_dir / "rank0.driver").read_text())
        lost = next(i for i, p in enumerate(procs) if p.pid != rank0)
        os.killpg(procs[lost].pid, signal.SIGKILL)
        procs[lost].wait()
        replaced_at = time.time()
        procs.append(_driver(settings, proxies[lost].port, logs[2]))
        codes = [procs[1 - lost].wait(200), procs[2].wait(200)]
    finally:
        for proc in procs:
            stop_process(proc)
        for log in logs:
            log.close()
        for proxy in proxies:
            proxy.cut()
    texts = [(tmp_path / f"node{i}.log").read_text() for i in range(3)]
    assert codes == [0, 0], [text[-3000:] for text in texts]
    digests = [line.split()[1] for text in texts for line in text.splitlines()
               if line.startswith("DIGEST") and line.split()[1] != "None"]
    assert digests == [baseline.return_value["digest"]]  # bit-identical
    starts = (out_dir / "starts").read_text().split()
    assert starts[0] == "0" and int(starts[-1]) >= 2, starts  # resumed, not started over
    assert data_gets(proxies[lost], replaced_at) == []  # 0 checkpoint bytes from the store
