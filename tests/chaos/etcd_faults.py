"""The chaos suite's faults on the etcd rendezvous' watches (#37): etcd out of reach in
the ways that break or silence a watch stream, while the nodes must re-form.

Each trial is a launched job of agents on our etcd handler running the launch script
(its digest does not depend on the world size, so every trial's final weights must
match the uninterrupted run's):

``etcd_silent``: two agents (``--nnodes 1:2``) reach etcd through a proxy. At the
fault time, once both watch the next round, the proxy forgets the flows of their
watch streams (a NAT's idle timeout: they never carry anything again) and holds every
other flow for a drawn ``stall_s`` (a partition); meanwhile the worker of node
``trial.rank`` raises, so the nodes re-form while etcd is silent and after: each must
get its seal, though the watch of the next round it kept is dead.
``etcd_compacted_restart``: two agents (``--nnodes 1:3``) train; at the fault time
etcd compacts its history past where the members' watches of the next round would
resume and is SIGKILLed, a third agent starts, and etcd starts again: the members must
count the waiting newcomer (their watches cannot resume) and take it in: a start of
world size 3 follows the fault.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tests.chaos.faults import (
    EPOCHS,
    LAUNCH_SCRIPT,
    Outcome,
    StorageWatcher,
    Trial,
    _at_fault_time,
    _launched_outcome,
    _write_atomically,
)
from tests.chaos.node_faults import _worlds
from tests.conftest import StorageUnderTest, wait_until
from tests.support.etcd_server import EtcdServer, client, etcd_binary, run_keys
from tests.support.paths import REPO
from tests.support.process_tree import stop_logged
from tests.support.servers import TcpProxy

STALL_RANGE_S = (0.2, 2.0)  # etcd_silent: within the liveness TTL (2 s), so that the
# nodes join before a seal, and the one not sealing awaits it on its dead watch


def run_etcd_trial(trial: Trial, storage: StorageUnderTest, tmp_path, name: str) -> Outcome:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    etcd = EtcdServer(etcd_binary())
    etcd.start()
    proxy = TcpProxy(etcd.client_port) if trial.kind == "etcd_silent" else None
    endpoint = f"127.0.0.1:{proxy.port}" if proxy is not None else etcd.endpoint
    # etcd_compacted_restart: epochs slow until the newcomer is in, so that the job does
    # not end before it could be (as launch_script's --slow-until-world says)
    nnodes, sleep, full = ("1:2", "0.3", "2") if trial.kind == "etcd_silent" else \
        ("1:3", "1", "3")
    run_storage = storage.run(name)
    agents: list[tuple[subprocess.Popen, object]] = []

    def agent(i: int) -> subprocess.Popen:
        log = open(tmp_path / f"agent{i}.log", "w")  # noqa: SIM115 (closed with the agent)
        proc = subprocess.Popen(
            [sys.executable, "-m", "elastic_train.cli", "launch", "--nnodes", nnodes,
             "--nproc-per-node", "1", "--rdzv-backend", "etcd", "--rdzv-endpoint", endpoint,
             "--rdzv-id", name, "--max-restarts", "3", "--storage-path", storage.url,
             LAUNCH_SCRIPT, str(out_dir), str(EPOCHS + 3), "--sleep", sleep,
             "--slow-until-world", full, "--crash-file", str(tmp_path / "crash")],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "ET_TEST_NODE": str(i)})
        agents.append((proc, log))
        return proc

    def log_of(i: int) -> str:
        return (tmp_path / f"agent{i}.log").read_text()

    with StorageWatcher(run_storage) as watcher:
        try:
            agent(0)
            assert wait_until(lambda: any(k.endswith(b"/c/sealer")
                                          for k in run_keys(etcd.endpoint, name)), 60)
            agent(1)
            assert _at_fault_time(trial, storage, name, tmp_path, world_size=2), \
                "no checkpoint of the two-node job"
            if proxy is not None:
                _silence(proxy, trial, tmp_path)
            else:
                _compact_and_restart(etcd, agent)
            for i, (proc, _) in enumerate(agents):
                assert proc.wait(180) == 0, log_of(i)[-3000:]
        finally:
            stop_logged(agents)
            if proxy is not None:
                proxy.cut()
            etcd.stop()
    logs = "".join(log_of(i) for i in range(len(agents)))
    outcome = _launched_outcome(logs, run_storage, watcher, tmp_path, out_dir)
    if trial.kind == "etcd_compacted_restart" and 3 not in _worlds(out_dir):  # 3: after it
        outcome.kind_failures.append(f"the newcomer was never taken in: {_worlds(out_dir)}")
    return outcome


def _silence(proxy: TcpProxy, trial: Trial, tmp_path) -> None:
    """etcd_silent's fault: the watch flows forgotten, every other one held for
    ``stall_s``, and node ``trial.rank``'s worker raising meanwhile."""
    assert wait_until(lambda: proxy.flows("/v3/watch") >= 2, 30), "a node watches nothing"
    proxy.forget("/v3/watch")  # each node's watch of the next round, and any other
    proxy.freeze()
    _write_atomically(tmp_path / "crash", str(trial.rank))
    time.sleep(float(trial.detail("stall_s")))
    proxy.thaw()


def _compact_and_restart(etcd: EtcdServer, agent) -> None:
    """etcd_compacted_restart's fault: history compacted to now (a little of it written
    first, so that the compaction passes the members' watches), etcd SIGKILLed, a third
    agent started, etcd started again on its data."""
    etcd_client = client(etcd.endpoint)
    for i in range(3):
        etcd_client.put(f"/chaos-compaction/{i}", "x")
    revision = int(etcd_client.status()["header"]["revision"])
    etcd_client.post(etcd_client.get_url("/kv/compaction"),
                     json={"revision": str(revision), "physical": True})
    etcd.kill()
    agent(2)
    time.sleep(2)
    etcd.start()
