"""NFS negative caching: a node whose client still answers "not found" for a commit marker
that another node wrote seconds ago must not delete that checkpoint when it becomes rank 0.

Storage is local disk seen through :class:`tests.support.stale_fs.NodeCacheFS`: each
node's lookups of a missing file are remembered for 20 s (NFS's ``acdirmin``, 30 s by
default) unless the node lists the directory again. The driver of the surviving node
polls the markers of reported checkpoints while they upload (as every node's live view
does), so its cache holds "not found" for a marker that rank 0's node then writes --
and rank 0's node dies.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.conftest import wait_until
from tests.support.nodes import node_drivers, node_log
from tests.support.stale_fs import NODE_ENV

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300),
              pytest.mark.usefixtures("no_leaked_processes")]


def _committed(run_dir: str) -> set[str]:
    if not os.path.isdir(run_dir):
        return set()
    return {name for name in os.listdir(run_dir)
            if os.path.exists(os.path.join(run_dir, name, ".commit.json"))}


def _index(name: str) -> int:
    return int(name.rsplit("_", 1)[1])


def test_new_rank0_keeps_a_checkpoint_its_node_cached_as_missing(storage_path, tmp_path,
                                                                  etcd_endpoint):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    run_dir = os.path.join(storage_path, "nfs")
    settings = {"storage": storage_path, "name": "nfs", "out_dir": str(out_dir), "epochs": 30,
                "rendezvous": {"backend": "etcd", "endpoint": etcd_endpoint},
                "nodes": [1, 2], "max_failures": 1,
                "stale_fs": {"cache_dir": str(tmp_path / "cache"), "negative_ttl_s": 20.0,
                             "slow_marks_s": 1.5}}
    with node_drivers(settings, tmp_path, [{NODE_ENV: "node0"}, {NODE_ENV: "node1"}]) as procs:
        # Each driver's first lookups (metrics.jsonl, before the first report) stay cached
        # for 20 s; past that, each node's live view polls the markers of reported
        # checkpoints while they upload.
        assert wait_until(lambda: _committed(run_dir), 200), "no checkpoint committed"
        first = time.monotonic()
        assert wait_until(lambda: time.monotonic() - first > 22, 30)
        newest = max(map(_index, _committed(run_dir)))
        marker = os.path.join(run_dir, f"checkpoint_{newest + 1:06d}", ".commit.json")
        assert wait_until(lambda: os.path.exists(marker), 60), "no next checkpoint"
        rank0 = int((out_dir / "rank0.driver").read_text())
        [victim] = [p for p in procs if p.pid == rank0]
        os.killpg(victim.pid, signal.SIGKILL)  # rank 0's node, right after its commit
        before = _committed(run_dir)
        [survivor] = [p for p in procs if p is not victim]
        assert survivor.wait(200) == 0, node_log(tmp_path, procs.index(survivor))[-4000:]
    assert before <= _committed(run_dir), f"committed checkpoints deleted: {before}"
    starts = [int(line) for line in (out_dir / "starts").read_text().split()]
    latest = max(map(_index, before))
    assert starts[-1] >= latest + 1, f"resumed from an older checkpoint: {starts}"
