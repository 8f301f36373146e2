"""Which node of a multi-node job is at fault for a failed attempt (the decision, and the
exchange of the nodes' reports through a real torch store)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from torch.distributed import HashStore
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from elastic_train import WorkerFailure
from elastic_train.agent.attribution import FailureExchange, NodeReport, at_fault_of, charged
from elastic_train.agent.failures import observe
from elastic_train.worker import lifecycle


def report(group_rank: int, own: bool = False, first: float = math.inf) -> NodeReport:
    root = WorkerFailure(rank=group_rank, local_rank=0, pid=100 + group_rank, exitcode=1,
                         message="ConnectionRefusedError: [Errno 111] Connection refused",
                         traceback=None)
    return NodeReport(group_rank, own, first, root)


def test_a_node_whose_worker_ended_by_itself_is_at_fault_at_once():
    mine = report(1, own=True)
    assert charged(mine, [], nodes=2) is mine


def test_another_nodes_own_failure_makes_this_one_free():
    mine, other = report(0, first=5.0), report(1, own=True)
    assert charged(mine, [other], nodes=2) is other


@pytest.mark.parametrize("first,expected", [((1.0, 2.0), 0), ((2.0, 1.0), 1),
                                            ((1.0, 1.0), 0), ((math.inf, 3.0), 1),
                                            ((math.inf, math.inf), 0)])
def test_otherwise_the_node_that_raised_first_is_at_fault(first, expected):
    """Someone pays for every attempt all nodes took part in: a rank that fails the same
    way each time ends the job within its node's budget."""
    reports = [report(rank, first=t) for rank, t in enumerate(first)]
    for mine in reports:
        at_fault = charged(mine, [r for r in reports if r is not mine], nodes=2)
        assert at_fault is reports[expected]


def test_a_node_that_did_not_tell_leaves_nobody_at_fault():
    """It left the job (a membership change) or settles its own case later."""
    assert charged(report(0, first=1.0), [report(1, first=2.0)], nodes=3) is None


def test_reports_round_trip_through_json():
    for original in (report(2, first=1.5), report(0, own=True)):
        assert NodeReport.from_json(original.to_json()) == original


def _share_all(reports: list[NodeReport], store, wait_s: float = 10.0) -> dict[int, list]:
    seen: dict[int, list] = {}

    def agent(mine: NodeReport) -> None:
        seen[mine.group_rank] = FailureExchange(store, "gen1", wait_s=wait_s).share(
            mine, nodes=len(reports))

    threads = [threading.Thread(target=agent, args=(r,)) for r in reports]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return seen


def test_the_nodes_learn_each_others_reports_through_the_store():
    reports = [report(0, first=2.0), report(1, first=1.0), report(2)]
    seen = _share_all(reports, HashStore())
    for mine in reports:
        others = sorted(seen[mine.group_rank], key=lambda r: r.group_rank)
        assert others == [r for r in reports if r is not mine]
        assert charged(mine, others, nodes=3) == reports[1]


def test_a_node_at_fault_by_itself_does_not_wait():
    store = HashStore()
    assert FailureExchange(store, "g", wait_s=30).share(report(0, own=True), nodes=4) == []
    # ... and the others learn of it without waiting for the rest.
    [other] = FailureExchange(store, "g", wait_s=30).share(report(1, first=1.0), nodes=4)
    assert other.own and other.group_rank == 0


def test_a_healthy_node_reads_what_the_others_told_without_waiting():
    """Its workers still run as its group restarts for a waiting node: a node that told a
    failed attempt of this generation is why (its root cause is the failure to record)."""
    store = HashStore()
    healthy = FailureExchange(store, "g", wait_s=30)
    assert healthy.told(nodes=3, group_rank=0) == []  # nobody told: a node joins
    for rank, first in ((1, 4.0), (2, 2.0)):
        exchange = FailureExchange(store, "g", wait_s=0.05)
        exchange.share(exchange.announce(report(rank, first=first)), nodes=3)
    started = time.monotonic()
    told = healthy.told(nodes=3, group_rank=0)
    assert time.monotonic() - started < 1.0
    assert sorted(r.group_rank for r in told) == [1, 2] and at_fault_of(told).group_rank == 2
    assert FailureExchange(store, "other generation").told(nodes=3, group_rank=0) == []


def test_a_silent_node_is_waited_for_only_so_long():
    store = HashStore()
    assert FailureExchange(store, "g", wait_s=0.2).share(report(0, first=1.0), nodes=2) == []


def test_an_unreachable_store_leaves_the_node_to_decide_alone():
    class Gone:
        def set(self, key, value):
            raise RuntimeError("Connection reset by peer")

    assert FailureExchange(Gone(), "g").share(report(0, first=1.0), nodes=2) == []


def _worker_fails(tmp_path, monkeypatch, name: str, exc: BaseException, store,
                  clock_offset_s: float) -> Any:
    """A worker of one node raises ``exc`` and records it as our workers do, on a node
    whose clock is ``clock_offset_s`` off; returns the failure as its agent reads it."""
    real = time.time
    path = str(tmp_path / f"{name}.json")
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", path)
    monkeypatch.setenv("ELASTIC_TRAIN_GENERATION", "gen1")
    monkeypatch.setattr(lifecycle, "_group_store", lambda: store, raising=False)
    with monkeypatch.context() as m:
        m.setattr(lifecycle.time, "time", lambda: real() + clock_offset_s)
        lifecycle.write_error_file(exc)
    return ProcessFailure(local_rank=0, pid=4242, exitcode=1, error_file=path)


def test_the_node_that_failed_first_is_charged_whatever_its_clock(tmp_path, monkeypatch):
    """Node 0's worker raises; node 1's, whose peer is gone, raises gloo's plain error
    milliseconds later -- but node 0's clock runs 50 ms ahead. The group's store orders
    the failures, not the nodes' clocks: node 0 is at fault, on both nodes."""
    store = HashStore()
    real = _worker_fails(tmp_path, monkeypatch, "node0", ConnectionRefusedError(
        111, "Connection refused"), store, clock_offset_s=0.050)
    time.sleep(0.005)
    caused = _worker_fails(tmp_path, monkeypatch, "node1", RuntimeError(
        "[gloo/transport/tcp/pair.cc:534] Connection closed by peer"), store, 0.0)
    reports = [NodeReport.of(rank, observe(SimpleNamespace(failures={rank: failure})))
               for rank, failure in enumerate((real, caused))]
    seen = _share_all(reports, store)
    for mine in reports:
        at_fault = charged(mine, seen[mine.group_rank], nodes=2)
        assert at_fault is not None and at_fault.group_rank == 0, at_fault
        assert "ConnectionRefusedError" in at_fault.root.message


def test_failures_without_a_group_store_are_ordered_by_announcement():
    """Workers that could not take their place in the group's order (no process group
    yet, store gone): the node that told first is at fault, not the earlier clock."""
    store = HashStore()
    late_clock = report(1)
    early = FailureExchange(store, "g").announce(report(0))
    later = FailureExchange(store, "g").announce(late_clock)
    for mine, other in ((early, later), (later, early)):
        assert charged(mine, [other], nodes=2).group_rank == 0


_WORKER = """
import json, os, sys
import torch.distributed as dist
from elastic_train.worker import lifecycle
lifecycle.write_error_file(ValueError("before the group"))
first = json.load(open(os.environ["TORCHELASTIC_ERROR_FILE"]))
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
seqs = []
for _ in range(2):
    lifecycle.write_error_file(ValueError("boom"))
    seqs.append(json.load(open(os.environ["TORCHELASTIC_ERROR_FILE"])))
print(json.dumps([d["message"]["extraInfo"][lifecycle.FAILED_SEQ] for d in [first, *seqs]]))
"""


@pytest.mark.timeout(120)
def test_a_worker_takes_its_place_from_its_process_groups_store(tmp_path):
    """Before its process group exists a worker has no place (None); then 1, 2, ..."""
    out = subprocess.run([sys.executable, "-c", _WORKER], capture_output=True, text=True,
                         timeout=100, check=True, env={
                             **os.environ, "TORCHELASTIC_ERROR_FILE": str(tmp_path / "e.json"),
                             "ELASTIC_TRAIN_GENERATION": "g1"})
    assert json.loads(out.stdout.splitlines()[-1]) == [None, 1, 2]


def test_the_recording_node_names_the_root_cause_of_a_peers_failure(tmp_path, monkeypatch):
    """Chaos kind ``clock_skew`` (#24): node 1's worker raises (node 1's clock runs 30 s
    behind); node 0's collective breaks on it. Node 0 (group rank 0) records the run's
    failures in run.json: its free restart (``peer``) named its own gloo error as the root
    cause, and rank 1's error was nowhere in run.json. The root cause recorded is node 1's
    error now, and ``failed_at`` stays on node 0's clock, as the record's ``time`` is."""
    from torch.distributed.elastic.agent.server.api import RunResult, WorkerState

    from elastic_train.agent.failures import failures_of
    from elastic_train.agent.local_agent import TrainAgent
    from elastic_train.agent.options import AgentEvents, AgentOptions
    from elastic_train.agent.restart_budget import RestartBudget
    from elastic_train.driver.run_record import RunRecord
    from elastic_train.storage.run_state import FailureKind
    from tests.conftest import make_storage

    store = HashStore()
    raised = _worker_fails(tmp_path, monkeypatch, "node1", RuntimeError("crash on node 1"),
                           store, clock_offset_s=-30.0)
    caused = _worker_fails(tmp_path, monkeypatch, "node0", RuntimeError(
        "[gloo/transport/tcp/pair.cc:534] Connection closed by peer"), store, 0.0)
    node1 = FailureExchange(store, "gen1").announce(
        NodeReport.of(1, observe(SimpleNamespace(failures={1: raised}))))
    store.set("elastic_train/failed/gen1/1", node1.to_json())  # node 1 has told
    run = make_storage("local", tmp_path, None).run("run")
    record = RunRecord.begin(run, "run", {"train_function": "jobs.train"})
    agent = TrainAgent.__new__(TrainAgent)  # node 0's agent: its decision and its callback
    agent.options, agent._generation = AgentOptions(), "gen1"
    agent.events = AgentEvents(on_failure=record.record_failure)
    agent.budget, agent.peer_root = RestartBudget(0), None
    group = SimpleNamespace(group_world_size=2, group_rank=0, store=store,
                            spec=SimpleNamespace(max_restarts=0))
    result = RunResult(state=WorkerState.FAILED, failures={0: caused})
    decision = agent._decide(group, failures_of(result), agent._classify(group, result))
    assert decision.kind is FailureKind.PEER and decision.restart
    [failure] = run.read_run_state().failures
    assert failure.kind is FailureKind.PEER
    assert (failure.root.rank, failure.root.message) == (1, "RuntimeError: crash on node 1")
    assert [w.rank for w in failure.workers] == [1, 0]  # then this node's own
    assert abs(failure.failed_at - time.time()) < 10  # node 0's clock, not node 1's
