"""Peer replicas with real nodes: two ``fit()`` drivers (one worker each, etcd rendezvous)
on moto's S3, each node through a proxy of its own that records its requests
(:func:`tests.support.peer_faults.run_two_nodes`). Node 1's worker wipes its node's local
tier and raises; the restart restores node 1's share (its ballast file) and the model
file from node 0's replica server, or, when node 0's copies were corrupted, from the
store. Either way the run ends bit-identical to an uninterrupted one."""

from __future__ import annotations

import pytest

from tests.conftest import EPOCHS, make_storage
from tests.support.peer_faults import TwoNodes, run_two_nodes

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240),
              pytest.mark.usefixtures("no_leaked_processes")]


def run_with_wiped_node(tmp_path, s3_endpoint, etcd_endpoint, peer: str,
                        baseline) -> TwoNodes:
    """Node 1 wipes its tier at epoch 2 (and does ``peer`` to its peers' copies)."""
    ran = run_two_nodes(
        make_storage("s3", tmp_path, s3_endpoint), tmp_path,
        {"backend": "etcd", "endpoint": etcd_endpoint},
        {"how": "wipe_tier", "peer": peer, "rank": 1, "epoch": 2, "batch": 0,
         "marker": str(tmp_path / "wiped")},
        name="peers", epochs=EPOCHS, checkpoint={"peer_replicas": 1},
        train={"ballast_mb": 1, "upload_mode": "SYNC"})
    assert ran.codes == [0, 0], [log[-3000:] for log in ran.logs]
    assert ran.digest == baseline.return_value["digest"]  # bit-identical
    starts = (tmp_path / "out" / "starts").read_text().split()
    assert starts[0] == "0" and int(starts[-1]) == 2, starts  # resumed at epoch 2
    assert any(name.endswith("checkpoint_000001/ballast.bin") for name in ran.held), ran.held
    return ran


def test_a_wiped_node_restores_its_share_from_its_peer_not_the_store(
        tmp_path, s3_endpoint, etcd_endpoint, baseline):
    ran = run_with_wiped_node(tmp_path, s3_endpoint, etcd_endpoint, "keep", baseline)
    assert ran.store_reads == []  # 0 bytes of checkpoint files from the store


def test_a_corrupted_copy_on_the_peer_falls_back_to_the_store(
        tmp_path, s3_endpoint, etcd_endpoint, baseline):
    ran = run_with_wiped_node(tmp_path, s3_endpoint, etcd_endpoint, "corrupt", baseline)
    assert any(p.endswith("/checkpoint_000001/ballast.bin") for p in ran.store_reads), ran
