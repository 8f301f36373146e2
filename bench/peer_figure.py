"""Figure 10b: a node whose local tier is gone restores its share from a peer, or from the
remote store throttled to a node's bandwidth.

Two ``elastic-train launch`` agents on this machine (one worker each, c10d), the run on
moto's S3 server, each agent reaching it through a TCP proxy of its own capped at
``PEER_LINK_BYTES_PER_S`` each way (1 Gbit/s: a realistic per-node share of a store's
bandwidth). The script (:mod:`bench.peer_job`) checkpoints ``peer_restore_mb`` MiB per
rank each epoch; after epoch 1's checkpoint rank 1 wipes its node's local tier and
exits, and the restarted group resumes from that checkpoint: rank 1 restores its share
from node 0's copy (``--peer-replicas 1``, our default) or from the store
(``--peer-replicas 0``). Measured on rank 1: its first ``get_checkpoint()`` after the
restart (the session's start, where the share is checked and brought to the node),
and the bytes node 1's proxy passed from the store meanwhile.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from typing import Any

import fsspec

from bench import procs
from bench.report import Table
from bench.stats import Summary, Target, ratio, with_target
from bench.variants import ELASTIC_TRAIN_CLI, REPO

PEER_LINK_BYTES_PER_S = 125e6  # 1 Gbit/s
PEER_TARGET = Target(0.5, at_least=False)
VARIANTS = (1, 0)  # --peer-replicas
BUCKET = "bench-peers"
MIB = 1 << 20
NODE_VAR = "PEER_BENCH_AGENT"  # which agent (0, 1) a worker runs under: its proxy


def _agents(suite: Any, endpoint: str, copies: int, rep: int, work: str
            ) -> tuple[list[procs.RunResult | None], list[Any], str]:
    """Runs the two agents to the end; returns their results, their proxies and the
    events directory."""
    from tests.support.servers import TcpProxy

    target = int(endpoint.rsplit(":", 1)[1])
    proxies = [TcpProxy(target, PEER_LINK_BYTES_PER_S, PEER_LINK_BYTES_PER_S) for _ in (0, 1)]
    events = tempfile.mkdtemp(dir=work)
    name = f"peers-{copies}-{rep}"
    rendezvous = f"127.0.0.1:{procs.free_port()}"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1",
           "PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)}
    results: list[procs.RunResult | None] = [None, None]

    def agent(i: int) -> None:
        cmd = [*ELASTIC_TRAIN_CLI, "launch", "--nnodes", "2", "--nproc-per-node", "1",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", rendezvous, "--rdzv-id", name,
               "--max-restarts", "1", "--quiet", "--storage-path", f"s3://{BUCKET}/runs",
               "--storage-option", f"endpoint_url=http://127.0.0.1:{proxies[i].port}",
               "--num-to-keep", "1", "--peer-replicas", str(copies),
               os.path.join(REPO, "bench", "peer_job.py"),
               "--size-mb", str(int(suite.profile.peer_restore_mb)), "--epochs", "3",
               "--wipe-epoch", "1", "--events", events]
        results[i] = procs.run(cmd, {**env, NODE_VAR: str(i)}, REPO, suite.profile.timeout_s,
                               os.path.join(work, f"{name}-node{i}.log"))

    threads = [threading.Thread(target=agent, args=(i,)) for i in (0, 1)]
    for i, thread in enumerate(threads):
        thread.start()
        if i == 0:
            time.sleep(1.5)  # the first agent binds the endpoint: it hosts the store
    for thread in threads:
        thread.join()
    for proxy in proxies:
        proxy.cut()
    return results, proxies, events


def _once(suite: Any, endpoint: str, copies: int, rep: int, work: str) -> dict[str, float]:
    results, proxies, events = _agents(suite, endpoint, copies, rep, work)
    if not all(r is not None and r.returncode == 0 for r in results):
        tail = results[1].output_tail[-800:] if results[1] else ""
        raise RuntimeError(f"figure 10b, --peer-replicas {copies}: an agent failed: {tail}")
    with open(os.path.join(events, "rank1.jsonl")) as f:
        restored = next(e for e in map(json.loads, f) if e["event"] == "restored")
    node1 = proxies[restored["agent"]]  # the agent that ran rank 1
    start, end = restored["start"], restored["end"]
    return {"restore_s": end - start, "share_mib": restored["share_bytes"] / MIB,
            "store_mib": node1.downloaded_between(start, end) / MIB,
            "share_gets": sum(1 for at, method, path in node1.requests
                              if start <= at <= end and method == "GET" and "/share_" in path)}


def peer_restore(suite: Any) -> list[Table]:
    """Figure 10b: restoring a wiped node's share, from a peer vs the throttled store."""
    from tests.support.servers import MotoS3Server, s3_options

    work = tempfile.mkdtemp(prefix="bench_peer_restore_")
    moto = MotoS3Server()
    rows: dict[int, list[dict[str, float]]] = {copies: [] for copies in VARIANTS}
    try:
        fsspec.filesystem("s3", **s3_options(moto.endpoint)).mkdir(BUCKET)
        for rep in range(suite.profile.repeat):
            for copies in VARIANTS:
                rows[copies].append(_once(suite, moto.endpoint, copies, rep, work))
                suite.echo(f"  [peer_restore] rep {rep + 1}/{suite.profile.repeat} "
                           f"--peer-replicas {copies}: {rows[copies][-1]}")
    finally:
        moto.stop()
        shutil.rmtree(work, ignore_errors=True)
    return [_table(rows, suite)]


def _table(rows: dict[int, list[dict[str, float]]], suite: Any) -> Table:
    table = Table("Figure 10b — a node whose local tier was wiped restores its share: from its "
                  "peer vs from S3 throttled to 1 Gbit/s per node (2 launch agents × 1 worker; "
                  "rank 1, median (min–max))",
                  ["restored from", "restore s", "share MiB", "MiB from the store meanwhile",
                   "GETs of share files", f"time / store's ({PEER_TARGET.describe()})",
                   f"time / a 1 Gbit/s store's least ({PEER_TARGET.describe()})"])
    store = Summary.of([r["restore_s"] for r in rows[0]])
    least = Summary.of([r["share_mib"] * MIB / PEER_LINK_BYTES_PER_S for r in rows[0]])
    for copies, label in ((1, "peer (`--peer-replicas 1`, the default)"),
                          (0, "store (`--peer-replicas 0`)")):
        got = Summary.of([r["restore_s"] for r in rows[copies]])
        table.add(label, got.fmt(2), Summary.of([r["share_mib"] for r in rows[copies]]).fmt(0),
                  Summary.of([r["store_mib"] for r in rows[copies]]).fmt(2),
                  Summary.of([r["share_gets"] for r in rows[copies]]).fmt(0),
                  with_target(ratio(got, store), PEER_TARGET) if copies else "1",
                  with_target(ratio(got, least), PEER_TARGET) if copies else
                  f"{ratio(got, least) or float('nan'):.2f} (least: {least.fmt(2)} s)")
    table.notes += [
        f"{suite.profile.repeat} repetition(s), variants interleaved. `python -m bench.peer_job` "
        "under `elastic-train launch --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d`: every "
        "rank reports a file of random bytes each epoch (SYNC); after epoch 1's checkpoint "
        "rank 1 removes its node's local tier and exits 1; the group restarts (new processes) "
        "and resumes from that checkpoint.",
        "Restore s: rank 1's first get_checkpoint() after the restart, the session's start: "
        "rank 0 lists the run, every rank checks its share against the manifest and brings "
        "what its node lacks (here, all of it) from the peer's replica server, else the store, "
        "then the ranks agree. MiB from the store: what node 1's proxy passed from moto in "
        "that time, response headers of its small requests included; GETs of share files: "
        "its requests for checkpoint data in that time, from the proxy's request lines.",
        "Each agent reaches moto through a TCP proxy of its own, capped at 125 MB/s (1 Gbit/s) "
        "each way. The peer's copy travels over loopback, unthrottled. moto's server, s3fs "
        "and the proxy on this busy machine deliver far less than the cap, so the last "
        "column also compares the peer with the least time a store at exactly 1 Gbit/s would "
        "take for the share (its size / 125 MB/s, no request overhead).",
        "What loopback cannot show: both nodes share this machine's 2 cores and one disk, so "
        "the peer transfer here is bounded by Python's HTTP server and CRC-32 on a busy CPU, "
        "not by a network; a real network adds latency per request and its own bandwidth "
        "limit (at 1 Gbit/s between nodes too, the peer and a 1 Gbit/s store would cost "
        "about the same per byte: the gain is then the store's bandwidth shared by every "
        "restoring node at once, and no store egress), and many nodes restoring at once "
        "from one peer each spread over the ring rather than queueing at the store.",
    ]
    return table
