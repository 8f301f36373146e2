"""A node asked to leave for a spare (agent/leave_for_spare.py): it leaves only once a
spare waits, stays (saying so once per request) while none does, reads the rendezvous
at most every look_s, and forgets a withdrawn request. The e2e proof is
tests/e2e/test_straggler_replacement.py."""

from __future__ import annotations

import logging

from elastic_train.agent.leave_for_spare import LeaveForSpare
from elastic_train.agent.node_policy import leave


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def swap(request, spares, clock=None):
    looked = []

    def count() -> int:
        looked.append(1)
        return spares()

    return LeaveForSpare(lambda: request[0], count, look_s=1.0, clock=clock or Clock()), looked


def test_not_asked_it_never_reads_the_rendezvous():
    request, waiting = [None], [1]
    decide, looked = swap(request, lambda: waiting[0])
    assert decide.verdict() is None and looked == []


def test_asked_with_a_spare_waiting_it_leaves_with_the_request():
    asked = leave("straggler: node 1 (rank 1) steps 3.0x slower", cool_off_s=600)
    decide, looked = swap([asked], lambda: 1)
    assert decide.verdict() == asked and len(looked) == 1


def test_without_a_spare_it_stays_says_so_once_and_leaves_when_one_comes(caplog):
    caplog.set_level(logging.WARNING, logger="elastic_train.agent.leave_for_spare")
    clock = Clock()
    asked = leave("straggler: node 1", cool_off_s=60)
    waiting = [0]
    decide, looked = swap([asked], lambda: waiting[0], clock)
    assert decide.verdict() is None
    assert decide.verdict() is None and len(looked) == 1  # within look_s: not read again
    clock.now = 1.5
    assert decide.verdict() is None and len(looked) == 2
    assert caplog.text.count("no spare waits") == 1
    clock.now, waiting[0] = 3.0, 1
    assert decide.verdict() == asked


def test_a_withdrawn_request_is_not_acted_on_and_a_new_one_is_told_again(caplog):
    caplog.set_level(logging.WARNING, logger="elastic_train.agent.leave_for_spare")
    clock = Clock()
    request = [leave("straggler: node 1 since iteration 4", 60)]
    decide, _ = swap(request, lambda: 0, clock)
    assert decide.verdict() is None
    request[0] = None  # the node is no longer slow
    clock.now = 2.0
    assert decide.verdict() is None
    request[0] = leave("straggler: node 1 since iteration 9", 60)
    clock.now = 4.0
    assert decide.verdict() is None
    assert caplog.text.count("no spare waits") == 2


def test_an_unreadable_rendezvous_counts_as_no_spare(caplog):
    def broken() -> int:
        raise ConnectionError("store gone")

    decide = LeaveForSpare(lambda: leave("straggler", 60), broken)
    assert decide.verdict() is None
    assert "Could not read whether a spare waits" in caplog.text
