"""Which node of a multi-node job is at fault for a failed attempt (the decision, and the
exchange of the nodes' reports through a real torch store)."""

from __future__ import annotations

import math
import threading

import pytest
from torch.distributed import HashStore

from elastic_train import WorkerFailure
from elastic_train.agent.attribution import FailureExchange, NodeReport, charged


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


def test_a_silent_node_is_waited_for_only_so_long():
    store = HashStore()
    assert FailureExchange(store, "g", wait_s=0.2).share(report(0, first=1.0), nodes=2) == []


def test_an_unreachable_store_leaves_the_node_to_decide_alone():
    class Gone:
        def set(self, key, value):
            raise RuntimeError("Connection reset by peer")

    assert FailureExchange(Gone(), "g").share(report(0, first=1.0), nodes=2) == []
