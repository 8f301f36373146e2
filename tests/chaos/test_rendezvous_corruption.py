"""A job whose rendezvous state is overwritten mid-run (#13): the nodes stop with an
error that names the state and the fix, and ``elastic-train restore`` continues the
run bit-identically. The chaos kind ``corrupt_rdzv_state`` at a fixed time, on both
kinds of state: c10d's (torch's handler, in the first node's TCP store) and our etcd
handler's round pointer. Before this test the c10d job ended with "The driver
stopped unexpectedly." in run.json and a C++ network error on the other node, and
the etcd job with a bare ValueError."""

from __future__ import annotations

import pytest

from tests.chaos.faults import Trial, run_trial
from tests.conftest import make_storage, pid_alive
from tests.support.etcd_server import etcd_binary


@pytest.mark.e2e
@pytest.mark.timeout(300)
@pytest.mark.parametrize("rank", [0, 1], ids=["c10d", "etcd"])
def test_a_corrupt_rendezvous_state_stops_the_job_and_restore_continues_it(
        rank, tmp_path, launch_baseline):
    if rank and etcd_binary() is None:
        pytest.skip("the etcd binary is not installed (apt-get install etcd-server)")
    trial = Trial(0, "corrupt_rdzv_state", epoch=2, batch=0, rank=rank)
    outcome = run_trial(trial, make_storage("local", tmp_path, None), tmp_path)
    assert outcome.digest == launch_baseline
    assert outcome.iterations == list(range(1, len(outcome.iterations) + 1))
    assert not outcome.partial_seen and not outcome.lost_commits
    assert not [pid for pid in outcome.orphans if pid_alive(pid)]
