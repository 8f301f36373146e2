"""Cooling off: a node that left is recorded in the run directory, and every admission
(its own check, our etcd handler's sealer) refuses it until its period is over."""

from __future__ import annotations

import json
import time

import pytest

from elastic_train._internal.departures import Departure, clock
from elastic_train.agent.cooling_off import CoolingOff
from elastic_train.agent.node_policy import ADMITTED, Candidate, NodePolicy, NodeStanding
from elastic_train.cli import render
from elastic_train.cli.run_summary import RunSummary
from elastic_train.driver.run_record import RunRecord
from elastic_train.errors import NodeLeftError
from elastic_train.storage import RunStorage
from elastic_train.storage.run_state import RunState
from tests.support.memory_etcd import sealed_with_a_second_joiner
from tests.support.node_policies import ADMITTED_VARIABLE, AdmitListed

LEFT = Departure("node7", "2 failures in a row charged to it", left_at=1000.0, cool_off_s=600)


def test_a_departure_says_who_why_and_how_long_is_left():
    assert LEFT.until == 1600.0
    assert LEFT.remaining_s(1060.0) == 540.0 and LEFT.remaining_s(2000.0) == 0.0
    assert LEFT.refusal(1060.0) == (
        f"node7 left the job at {clock(1000.0)} (2 failures in a row charged to it) and "
        f"cools off for another 540 s, until {clock(1600.0)}; to admit it sooner, delete "
        "departures/node7.json in the run directory")
    assert Departure("10.0.0.2/x", "", 0.0, 1.0).file_name == "10.0.0.2%2Fx.json"
    assert LEFT.describe() == ("Node node7 left the job: 2 failures in a row charged to it; "
                               f"not admitted again for 600 s, until {clock(1600.0)}")
    assert Departure.from_json(json.loads(json.dumps(LEFT.to_json()))) == LEFT


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_node_cooling_off_is_refused_until_its_period_is_over():
    time_now, reads = _Clock(1060.0), []
    policy = CoolingOff(NodePolicy(), lambda: reads.append(1) or [LEFT], clock=time_now)
    for here in (True, False):  # its own check, and a sealer's about it
        admission = policy.admit(Candidate("node7", here=here))
        assert not admission.admitted and admission.cool_off_s == 0  # no new period
        assert "cools off for another 540 s" in admission.reason
    assert policy.admit(Candidate("node8")) is ADMITTED
    assert len(reads) == 1  # one read serves a round's candidates
    time_now.now = 1600.0
    assert policy.admit(Candidate("node7", here=True)) is ADMITTED
    assert len(reads) == 2


def test_the_latest_departure_of_a_node_counts_and_the_wrapped_policy_is_asked_after(
        monkeypatch):
    monkeypatch.setenv(ADMITTED_VARIABLE, "node7")
    again = Departure("node7", "health check failed", left_at=1500.0, cool_off_s=300)
    policy = CoolingOff(AdmitListed(), lambda: [LEFT, again], clock=_Clock(1700.0))
    assert "until " + clock(1800.0) in policy.admit(Candidate("node7")).reason
    assert policy.admit(Candidate("node9")).reason == "node9 is not on the test's list"


def test_a_departures_read_that_fails_admits_with_a_warning(caplog):
    def broken() -> list[Departure]:
        raise OSError("storage down")

    assert CoolingOff(NodePolicy(), broken).admit(Candidate("node7")) is ADMITTED
    assert "Could not read which nodes left the job" in caplog.text


def test_the_node_refuses_itself_with_the_time_left():
    standing = NodeStanding(CoolingOff(NodePolicy(), lambda: [LEFT], clock=_Clock(1100.0)),
                            "node7")
    with pytest.raises(NodeLeftError) as raised:
        standing.check_admitted()
    assert raised.value.cool_off_s == 0  # a refusal does not start a new period
    assert str(raised.value).startswith(
        "Node node7 left the job: not admitted: node7 left the job at "
        f"{clock(1000.0)} (2 failures in a row charged to it) and cools off for another "
        "500 s")


def test_our_etcd_sealer_leaves_out_a_node_cooling_off():
    gone = Departure("10.0.0.2", "health check failed", left_at=time.time(), cool_off_s=600)
    info, keys, other, kv = sealed_with_a_second_joiner(CoolingOff(NodePolicy(),
                                                                    lambda: [gone]))
    assert (info.rank, info.world_size) == (0, 1)
    with pytest.raises(NodeLeftError, match="not admitted by the sealer of round 0: 10.0.0.2 "
                                            "left the job at .* cools off for another"):
        other.next_rendezvous()


def test_departures_are_stored_one_file_per_node(tmp_path):
    storage = RunStorage.open(str(tmp_path), "run")
    assert storage.read_departures() == []
    later = Departure("node/1", "sick", left_at=2000.0, cool_off_s=5)
    storage.write_departure(later)
    storage.write_departure(LEFT)
    assert storage.read_departures() == [LEFT, later]  # oldest first
    again = Departure("node7", "sick again", left_at=3000.0, cool_off_s=60)
    storage.write_departure(again)  # replaces the node's earlier one
    (tmp_path / "run" / "departures" / "junk.json").write_text("[1, 2]")
    assert storage.read_departures() == [later, again]


def test_run_json_lists_each_departure_once_and_show_prints_it(tmp_path):
    storage = RunStorage.open(str(tmp_path), "run")
    record = RunRecord.begin(storage, "run", {"command": ["train.py"]})
    assert record.note_departures([LEFT]) == [LEFT]
    assert record.note_departures([LEFT]) == []
    state = storage.read_run_state()
    assert state is not None and state.departures == [LEFT]
    assert RunState.from_json(state.to_json()).departures == [LEFT]
    lines = render.step_lines(state, RunSummary([], None, None, 0, []))
    assert lines[-2:] == ["left:     1 node(s)", f"  {render.when(1000.0)}  {LEFT.describe()}"]
