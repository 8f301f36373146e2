"""One driver records a run, whatever node is group rank 0: with etcd, group rank 0 goes
to the first node of a round, and after a failure on a node that does not record the
run that node is first to rejoin. The recording driver keeps the record; nobody else
writes ``run.json`` or the ledger's launch lines beside it."""

from __future__ import annotations

import pytest

from elastic_train.goodput.breakdown import breakdown
from elastic_train.storage import RunStorage
from elastic_train.storage import filesystem as fsutil
from tests.conftest import wait_until
from tests.support.etcd_server import run_keys
from tests.support.launched import SCRIPT, rank_starts, run_state, start_node
from tests.support.ledger_account import assert_adds_up
from tests.support.servers import stop_process

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("no_leaked_processes")]


@pytest.mark.timeout(120)
def test_a_node_that_rejoins_first_after_its_failure_does_not_record_too(
        etcd_endpoint, storage_path, tmp_path):
    """Two nodes (``--nnodes 2``, one worker each); the worker of the node that does not
    record the run (group rank 1) raises once while the recording node's worker sleeps
    (a slow node), so the failed node rejoins first and becomes group rank 0 of the next
    round. The run's record is still one driver's: one failure, one
    launch (finished), one ``end`` line in the ledger, and the ledger adds up."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    name = "recorded-once"
    logs = [open(tmp_path / f"node{i}.log", "w") for i in range(2)]  # noqa: SIM115
    procs = []
    try:
        for i, log in enumerate(logs):
            procs.append(start_node(["--nnodes", 2, "--nproc-per-node", 1, "--rdzv-backend",
                                     "etcd", "--rdzv-endpoint", etcd_endpoint, "--rdzv-id",
                                     name, "--max-restarts", 2, "--storage-path", storage_path,
                                     SCRIPT, out_dir, 4, "--sleep", 0.2, "--crash-at", 1,
                                     "--slow-node", "0:3"], log, node=i))
            if i == 0:  # node 0 seals the first round: group rank 0, it records the run
                assert wait_until(lambda: any(k.endswith(b"/c/sealer")
                                              for k in run_keys(etcd_endpoint, name)), 60)
        codes = [proc.wait(90) for proc in procs]
    finally:
        for proc in procs:
            stop_process(proc)
        for log in logs:
            log.close()
    output = [(tmp_path / f"node{i}.log").read_text()[-3000:] for i in range(2)]
    assert codes == [0, 0], output
    # The failed node was group rank 0 of the second round (else this test shows nothing).
    assert [node for rank, _, _, node in rank_starts(out_dir) if rank == 0] == [0, 1]
    state = run_state(storage_path, name)
    assert state["status"] == "finished", state
    assert len(state["failures"]) == 1, state["failures"]
    assert [launch["status"] for launch in state["launches"]] == ["finished"], state["launches"]
    fs, path = fsutil.resolve(f"{storage_path}/{name}")
    ledger = RunStorage(fs, path).read_ledger()
    events = [line["event"] for line in ledger if line.get("event") in ("launch", "end")]
    assert events == ["launch", "end"], ledger
    assert_adds_up(breakdown(ledger))
