"""The goodput ledger lines the recording driver writes when the group moves without a
plain failure: a node joining, and the record taken over from a lost recording node
(real run storage on local disk; the agent's events called as the agent calls them)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from elastic_train.agent.node_liveness import Beacon
from elastic_train.agent.restart_budget import Decision
from elastic_train.driver.run_record import RunRecord
from elastic_train.driver.supervisor import RunSupervisor
from elastic_train.errors import WorkerFailure
from elastic_train.goodput.breakdown import Cause, breakdown
from elastic_train.storage import RunStorage
from elastic_train.storage.run_state import FailureKind, RunStatus

SPEC = {"command": ["train.py"]}


def _events(storage: RunStorage) -> list[str]:
    return [e["event"] for e in sorted(storage.read_ledger(), key=lambda e: e["t"])]


def _failure(at: float) -> WorkerFailure:
    return WorkerFailure(rank=1, local_rank=0, pid=4242, exitcode=1, message="RuntimeError",
                         traceback=None, timestamp=at)


def _supervisor(storage: RunStorage) -> RunSupervisor:
    return RunSupervisor(storage, "run", begin_record=lambda takeover: RunRecord.begin(
        storage, "run", SPEC, takeover=takeover))


def _events_of(supervisor: RunSupervisor):
    spec = SimpleNamespace(nproc_per_node=1, rendezvous=None)
    monitor = SimpleNamespace(note_rendezvous=lambda *a: None, note_failure=lambda *a, **k: None,
                              note_recovered=lambda: None)
    return supervisor._agent_events(spec, monitor)


def _survivor(storage: RunStorage):
    """Node B of a run that node A records: B formed the first group as group rank 1.
    Its supervisor and the agent events it gets."""
    survivor = _supervisor(storage)
    events = _events_of(survivor)
    events.on_rendezvous(1, 2)
    assert survivor.record is None
    return survivor, events


def test_a_join_writes_join_and_rendezvous_and_counts_no_failure(tmp_path):
    storage = RunStorage.open(str(tmp_path), "run")
    record = RunRecord.begin(storage, "run", SPEC)
    record.note_join()
    record.note_rendezvous()
    assert _events(storage) == ["launch", "join", "rendezvous"]
    assert record.state.failures == []


def test_a_failure_during_a_join_gets_its_rendezvous_closed(tmp_path):
    storage = RunStorage.open(str(tmp_path), "run")
    record = RunRecord.begin(storage, "run", SPEC)
    record.note_join()
    record.record_failure([_failure(time.time())], Decision(FailureKind.FAILURE, True, 1))
    assert record.failure_open
    record.note_rendezvous()
    assert not record.failure_open and record.state.failures[-1].rendezvous_at is not None
    assert _events(storage) == ["launch", "join", "fault", "rendezvous"]


def test_a_takeover_writes_what_it_heard_and_no_second_launch(tmp_path):
    """Node A records (launch) and is lost; node B heard the failure at ``heard`` and
    becomes group rank 0 at the next rendezvous: B writes the fault, stamped when its
    agent knew, and the rendezvous."""
    storage = RunStorage.open(str(tmp_path), "run")
    RunRecord.begin(storage, "run", SPEC)  # node A's launch
    survivor, events = _survivor(storage)
    failed_at = time.time()
    events.on_failure([_failure(failed_at)], Decision(FailureKind.PEER, True, 1), None)
    heard = time.time()
    events.on_rendezvous(0, 1)  # A is gone: B is group rank 0
    assert _events(storage) == ["launch", "fault", "rendezvous"]
    [fault] = [e for e in storage.read_ledger() if e["event"] == "fault"]
    assert fault["failed_at"] == failed_at and fault["t"] <= heard
    assert len(survivor.record.state.failures) == 1


def test_a_takeover_does_not_record_again_what_the_lost_node_recorded(tmp_path):
    storage = RunStorage.open(str(tmp_path), "run")
    recorder = RunRecord.begin(storage, "run", SPEC)  # node A records B's failure, then goes
    recorder.record_failure([_failure(time.time())], Decision(FailureKind.FAILURE, True, 1))
    survivor, events = _survivor(storage)
    events.on_failure([_failure(time.time())], Decision(FailureKind.FAILURE, True, 1), None)
    events.on_rendezvous(0, 1)
    assert _events(storage) == ["launch", "fault", "rendezvous"]
    assert len(survivor.record.state.failures) == 1


def test_a_takeover_after_a_join_writes_the_join(tmp_path):
    storage = RunStorage.open(str(tmp_path), "run")
    RunRecord.begin(storage, "run", SPEC)
    _, events = _survivor(storage)
    events.on_join()
    events.on_rendezvous(0, 2)
    assert _events(storage) == ["launch", "join", "rendezvous"]
    assert breakdown(storage.read_ledger()).failures == 0


def test_what_was_heard_is_forgotten_at_the_next_rendezvous_and_recovery(tmp_path):
    storage = RunStorage.open(str(tmp_path), "run")
    RunRecord.begin(storage, "run", SPEC)
    _, events = _survivor(storage)
    events.on_failure([_failure(time.time())], Decision(FailureKind.FAILURE, True, 1), None)
    events.on_recovered(SimpleNamespace(replaced={}))  # the recorder saw it, in process
    events.on_rendezvous(0, 2)  # later, the recorder is lost without a failure heard
    assert _events(storage) == ["launch"]


def test_a_recorder_still_there_keeps_the_record_at_any_group_rank(tmp_path):
    """Node A records with a beacon; B fails and rejoins first (group rank 0): A answers,
    so B records nothing. Once A's beacon is gone, B's next round as rank 0 takes over."""
    storage = RunStorage.open(str(tmp_path), "run")
    beacon = Beacon("127.0.0.1")
    try:
        RunRecord.begin(storage, "run", SPEC, recorder=beacon.address)  # node A's launch
        survivor, events = _survivor(storage)
        events.on_failure([_failure(time.time())], Decision(FailureKind.FAILURE, True, 1), None)
        events.on_rendezvous(0, 2)
        assert survivor.record is None and _events(storage) == ["launch"]
    finally:
        beacon.close()
    events.on_failure([_failure(time.time())], Decision(FailureKind.PEER, True, 1), None)
    events.on_rendezvous(0, 1)
    assert survivor.record is not None
    assert _events(storage) == ["launch", "fault", "rendezvous"]


def test_at_the_end_group_rank_0_ends_a_launch_only_its_gone_recorder_left_running(tmp_path):
    """B is group rank 0 at its end and does not record: it takes the record over only
    when A's launch is still running and A's beacon is gone (A left after B's last
    rendezvous); not when A ended the launch before its beacon closed."""
    for name, ends in (("ended", True), ("left", False)):
        storage = RunStorage.open(str(tmp_path), name)
        beacon = Beacon("127.0.0.1")
        recorder = RunRecord.begin(storage, name, SPEC, recorder=beacon.address)
        survivor, events = _survivor(storage)
        events.on_rendezvous(0, 2)
        survivor.take_over_if_orphaned()  # A is there
        assert survivor.record is None
        if ends:
            recorder.set_status(RunStatus.FINISHED)
        beacon.close()
        survivor.take_over_if_orphaned()
        assert (survivor.record is None) is ends, name
        assert _events(storage) == ["launch", "end"] if ends else ["launch"]


def test_a_join_sorts_after_rank_0s_line_at_the_same_time():
    t = 105.0
    ledger = [{"event": "launch", "t": 100.0},
              {"event": "attempt", "t": 101.0, "started": 100.5, "restored_iteration": None},
              {"event": "join", "t": t},
              {"event": "work", "t": t, "from_iteration": 0, "iteration": 1, "productive": 4.0,
               "checkpoints": 1},
              {"event": "rendezvous", "t": 106.0}, {"event": "end", "t": 107.0}]
    goodput = breakdown(ledger)
    assert goodput.seconds[Cause.PRODUCTIVE] == 4.0 and goodput.checkpoints == 1
    assert goodput.seconds[Cause.RENDEZVOUS] == 1.0
