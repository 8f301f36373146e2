"""Peer replicas with real nodes: two ``fit()`` drivers (one worker each, etcd rendezvous)
on moto's S3, each node through a proxy of its own that records its requests. Node 1's
worker wipes its node's local tier and raises; the restart restores node 1's share (its
ballast file) and the model file from node 0's replica server, or, when node 0's copies
were corrupted, from the store. Either way the run ends bit-identical to an
uninterrupted one."""

from __future__ import annotations

import json

import pytest

from tests.support.nodes import node_drivers, node_log
from tests.support.servers import TcpProxy

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240),
              pytest.mark.usefixtures("no_leaked_processes")]

EPOCHS = 5  # tests.conftest's baseline


def data_gets(proxy: TcpProxy, since: float) -> list[str]:
    """The checkpoint files (not commit markers) this node read from the store since."""
    return [path for at, method, path in proxy.requests
            if at >= since and method == "GET" and "/checkpoint_" in path
            and ".commit.json" not in path and "list-type" not in path]


def run_with_wiped_node(tmp_path, s3_endpoint, etcd_endpoint, peer: str, baseline_digest,
                        trial_fault: dict | None = None) -> dict:
    """Runs the two-node job whose node 1 wipes its tier once (and does ``peer`` to its
    peers' copies); returns what node 1 read from the store after the wipe."""
    from tests.conftest import make_storage

    storage = make_storage("s3", tmp_path, s3_endpoint)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    target = int(s3_endpoint.rsplit(":", 1)[1])
    proxies = [TcpProxy(target), TcpProxy(target)]
    fault = {"how": "wipe_tier", "peer": peer, "rank": 1, "epoch": 2, "batch": 0,
             "marker": str(out_dir / "wiped"), "out_dir": str(out_dir), **(trial_fault or {})}
    settings = {"storage": storage.url, "storage_options": storage.options, "name": "peers",
                "out_dir": str(out_dir), "epochs": EPOCHS, "max_failures": 1,
                "rendezvous": {"backend": "etcd", "endpoint": etcd_endpoint}, "nodes": [2, 2],
                "fault": fault, "checkpoint": {"peer_replicas": 1},
                "train": {"ballast_mb": 1, "upload_mode": "SYNC"}}
    envs = [{"NODE_STORAGE_ENDPOINT": f"http://127.0.0.1:{p.port}"} for p in proxies]
    try:
        with node_drivers(settings, tmp_path, envs) as procs:
            codes = [proc.wait(200) for proc in procs]
    finally:
        for proxy in proxies:
            proxy.cut()
    logs = [node_log(tmp_path, i) for i in (0, 1)]
    assert codes == [0, 0], [log[-3000:] for log in logs]
    digests = [line.split()[1] for log in logs for line in log.splitlines()
               if line.startswith("DIGEST") and line.split()[1] != "None"]
    assert digests == [baseline_digest], digests
    with open(out_dir / "wiped.json") as f:
        wiped = json.load(f)
    node1 = next(p for p in proxies if p.port == int(wiped["endpoint"].rsplit(":", 1)[1]))
    starts = (out_dir / "starts").read_text().split()
    assert starts[0] == "0" and int(starts[-1]) == 2, starts  # resumed at epoch 2
    return {"gets": data_gets(node1, wiped["time"]), "held": wiped["held"],
            "bytes": node1.downloaded_between(wiped["time"], float("inf"))}


def test_a_wiped_node_restores_its_share_from_its_peer_not_the_store(
        tmp_path, s3_endpoint, etcd_endpoint, baseline):
    read = run_with_wiped_node(tmp_path, s3_endpoint, etcd_endpoint, "keep",
                               baseline.return_value["digest"])
    assert any("ballast.bin" in name for name in read["held"]), read["held"]
    assert read["gets"] == [], read  # 0 bytes of checkpoint files from the store
    print("node 1 read from the store after the wipe (markers, listings):", read["bytes"])


def test_a_corrupted_copy_on_the_peer_falls_back_to_the_store(
        tmp_path, s3_endpoint, etcd_endpoint, baseline):
    read = run_with_wiped_node(tmp_path, s3_endpoint, etcd_endpoint, "corrupt",
                               baseline.return_value["digest"])
    assert any(path.endswith("/checkpoint_000001/ballast.bin") for path in read["gets"]), read
