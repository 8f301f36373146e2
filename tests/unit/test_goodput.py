"""Unit tests: the goodput ledger read into wall time by cause, and its files on a store."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
import uuid

import fsspec
import pytest

from elastic_train.goodput import breakdown as breakdown_module
from elastic_train.goodput.breakdown import Cause, breakdown
from elastic_train.storage import RunStorage
from elastic_train.storage import filesystem as fsutil
from elastic_train.storage.jsonl_log import SEGMENT_BYTES
from elastic_train.storage.ledger_file import LedgerFile, QueuedLedger, read_ledger
from elastic_train.worker.attempt_clock import AttemptClock, RunHistory
from tests.support.long_ledger import long_ledger


def work(t, iteration, productive, checkpoint=0.0, stragglers=0.0, checkpoints=1, since=None):
    return {"event": "work", "t": t, "from_iteration": iteration - 1 if since is None else since,
            "iteration": iteration, "productive": productive, "checkpoint": checkpoint,
            "stragglers": stragglers, "checkpoints": checkpoints}


# A launch at 100; attempt 1 from 103 (ready 104), two checkpoint reports, a fault at
# 109.5 seen at 110, the group formed again at 111, attempt 2 resumes from iteration 1
# (its session at 112, ready at 113), reports once and ends; the launch ends at 116.
RUN = [
    {"event": "launch", "t": 100.0},
    {"event": "attempt", "t": 104.0, "started": 103.0, "restored_iteration": None},
    work(106.0, 1, productive=1.5, checkpoint=0.4, stragglers=0.1),
    work(108.0, 2, productive=1.8, checkpoint=0.2),
    {"event": "fault", "t": 110.0, "failed_at": 109.5, "kind": "failure"},
    {"event": "rendezvous", "t": 111.0},
    {"event": "attempt", "t": 113.0, "started": 112.0, "restored_iteration": 1},
    work(115.0, 2, productive=1.7, checkpoint=0.3),
    {"event": "end", "t": 116.0, "status": "finished"},
]


def test_every_second_goes_to_the_cause_known_where_it_was_spent():
    goodput = breakdown(RUN)
    assert goodput.wall_s == pytest.approx(16.0)
    assert sum(goodput.seconds.values()) == pytest.approx(goodput.wall_s)
    assert {c.value: round(s, 6) for c, s in goodput.seconds.items() if s} == {
        "startup": 3.0 + 1.0 + 1.0,  # launch -> session; session -> ready (fresh); rdzv -> session
        "productive": 1.5 + 1.7,     # iteration 2 of attempt 1 was lost ...
        "recompute": 1.8 + 1.5,      # ... and so was the work after its line, to the fault
        "checkpoint": 0.9, "stragglers": 0.1,
        "detection": 0.5, "rendezvous": 1.0, "restore": 1.0,
        "shutdown": 1.0,             # rank 0's last line -> the launch's end; and rank 0's
                                     # lines account for their gaps: no "other"
    }
    assert goodput.failures == 1 and goodput.checkpoints == 3
    first, second = goodput.attempts
    assert first.seconds[Cause.RECOMPUTE] == pytest.approx(3.3)  # lost in the attempt that failed
    assert first.wall_s == pytest.approx(9.5) and second.wall_s == pytest.approx(6.5)
    assert goodput.ettr == pytest.approx(3.2 / 16.0)


def test_the_order_of_the_lines_does_not_matter():
    assert breakdown(list(reversed(RUN))) == breakdown(RUN)


def test_a_preempted_nodes_outage_is_preemption():
    preempted = [dict(e, kind="preemption") if e["event"] == "fault" else e for e in RUN]
    seconds = breakdown(preempted).seconds
    assert seconds[Cause.PREEMPTION] == pytest.approx(1.5)
    assert seconds[Cause.DETECTION] == seconds[Cause.RENDEZVOUS] == 0


def test_a_driver_that_died_counts_up_to_its_last_line_and_a_relaunch_goes_on():
    died = RUN[:4]  # no fault, no end: the driver was lost after iteration 2's line at 108
    relaunch = [{"event": "launch", "t": 200.0},
                {"event": "attempt", "t": 202.0, "started": 201.0, "restored_iteration": 2},
                work(204.0, 3, productive=2.0),
                {"event": "end", "t": 205.0, "status": "finished"}]
    goodput = breakdown(died + relaunch + [{"event": "work", "t": 206.0, "productive": 9.0}])
    assert goodput.wall_s == pytest.approx(8.0 + 5.0)  # the dead time and the late line: not
    assert goodput.seconds[Cause.RESTORE] == pytest.approx(1.0)
    assert goodput.seconds[Cause.RECOMPUTE] == 0  # restored at the last line's iteration
    assert len(goodput.attempts) == 2


def test_a_signals_whole_second_is_not_taken_before_rank_0s_last_line():
    """torch stamps a SIGKILL to the second: 109.0 would fall before the line at 109.4."""
    run = [*RUN[:3], work(109.4, 2, productive=1.8, since=1), dict(RUN[4], failed_at=109.0),
           *RUN[5:]]
    seconds = breakdown(run).seconds
    assert seconds[Cause.DETECTION] == pytest.approx(0.6)
    assert sum(seconds.values()) == pytest.approx(16.0)


def test_an_empty_ledger_has_no_ettr():
    goodput = breakdown([])
    assert goodput.wall_s == 0 and goodput.ettr is None and goodput.share(Cause.OTHER) == 0


def test_a_ledger_file_appends_and_a_store_without_append_gets_segments(storage):
    """Local disk appends to one file per writer; S3 gets segments: both read back."""
    run = storage.run("run")
    run.ensure_writable()
    memory = RunStorage(fsspec.filesystem("memory"), f"/ledger-{uuid.uuid4().hex}/run")
    for storage in (run, memory):
        ledger = storage.ledger_file("rank0")
        ledger.append(RUN[0])
        ledger.append(*RUN[1:3])
        other = storage.ledger_file("driver")
        other.append(RUN[3])
        assert sorted(storage.read_ledger(), key=lambda e: e["t"]) == RUN[:4]


def test_a_ledger_line_costs_the_same_however_many_came_before(storage, monkeypatch):
    """On a store without append, a line rewrites one bounded segment, never the file."""
    storage = storage.run("long")
    storage.ensure_writable()
    ledger = storage.ledger_file("rank0")
    puts = []
    write = fsutil.write_bytes_atomic
    monkeypatch.setattr(fsutil, "write_bytes_atomic",
                        lambda fs, path, data: (puts.append(len(data)), write(fs, path, data)))
    lines = [work(float(t), t, productive=1.0) for t in range(1, 501)]
    for line in lines:
        ledger.append(line)
    assert max(puts, default=0) <= SEGMENT_BYTES and storage.read_ledger() == lines


def test_a_ledger_written_before_segments_still_reads():
    """One file per writer on a store without append, as before segments: read as it is."""
    fs, directory = fsspec.filesystem("memory"), f"/ledger-{uuid.uuid4().hex}/old/goodput"
    fs.pipe_file(f"{directory}/rank0-1-1.jsonl", "".join(json.dumps(e) + "\n"
                                                         for e in RUN[:3]).encode())
    assert read_ledger(fs, directory) == RUN[:3]


def test_a_line_cut_short_by_a_crash_is_skipped(tmp_path):
    directory = tmp_path / "goodput"
    directory.mkdir()
    (directory / "rank0-1-1.jsonl").write_text(json.dumps(RUN[0]) + "\n" + '{"event": "wo')
    assert read_ledger(fsspec.filesystem("file"), str(directory)) == [RUN[0]]


def test_an_unwritable_ledger_warns_once_and_writes_what_it_kept_later(tmp_path, caplog):
    directory = tmp_path / "goodput"
    ledger = LedgerFile(fsspec.filesystem("file"), str(directory), "rank0")
    directory.write_text("a file where the directory should be")
    with caplog.at_level(logging.WARNING):
        ledger.append(RUN[0])
        ledger.append(RUN[1])
    [warning] = [r.message for r in caplog.records]
    assert "Could not write the goodput ledger" in warning and "training goes on" in warning
    directory.unlink()
    ledger.append(RUN[2])
    assert read_ledger(fsspec.filesystem("file"), str(directory)) == RUN[:3]


def test_a_joining_node_ends_the_attempt_without_a_failure():
    """A node joins at 108.5 (nothing failed): rank 0's unwritten work since 108 is lost
    (recompute), the group forms again by 110 (rendezvous), and no failure is counted."""
    joined = [*RUN[:4], {"event": "join", "t": 108.5}, {"event": "rendezvous", "t": 110.0},
              {"event": "attempt", "t": 112.0, "started": 111.0, "restored_iteration": 2},
              work(114.0, 3, productive=2.0), {"event": "end", "t": 115.0, "status": "finished"}]
    goodput = breakdown(joined)
    assert goodput.failures == 0 and len(goodput.attempts) == 2
    assert goodput.seconds[Cause.RECOMPUTE] == pytest.approx(0.5)
    assert goodput.seconds[Cause.RENDEZVOUS] == pytest.approx(1.5)
    assert goodput.seconds[Cause.OTHER] == pytest.approx(0.0)
    assert sum(goodput.seconds.values()) == pytest.approx(goodput.wall_s) == 15.0


def live_run(taken_at: float) -> list[dict]:
    """RUN, but attempt 2 goes on from a survivor's copy taken at ``taken_at``, at report 2
    (its attempt line, written before the live recovery, says a fresh start)."""
    return [*RUN[:6], {**RUN[6], "restored_iteration": None},
            {"event": "live", "t": 113.1, "iteration": 2, "step": 40, "source_rank": 1,
             "taken_at": taken_at}, *RUN[7:]]


def test_a_long_ledger_with_many_faults_reads_as_counted_by_hand():
    """600 s of work lines every 10 s (8 s productive, 1 s checkpoint, 1 s stragglers),
    a checkpoint every 6th line, faults 5 s after lines 20 and 40: 2 and 4 lines since
    the last checkpoint are lost, and so are the 5 s each to the fault."""
    goodput = breakdown(long_ledger(600.0, faults=2))
    assert goodput.failures == 2 and goodput.checkpoints == 10 and len(goodput.attempts) == 3
    assert goodput.wall_s == pytest.approx(2.0 + 600.0 + 2 * 10.0 + 1.0)
    assert {c.value: round(s, 6) for c, s in goodput.seconds.items() if s} == {
        "productive": 60 * 8.0 - (2 + 4) * 8.0, "recompute": (2 + 4) * 8.0 + 2 * 5.0,
        "checkpoint": 60.0, "stragglers": 60.0, "startup": 2.0 + 2 * 1.0,
        "detection": 2 * 1.0, "rendezvous": 2 * 2.0, "restore": 2 * 1.0, "shutdown": 1.0}


def _lines_run(entries: list[dict]) -> int:
    """How many lines of :mod:`elastic_train.goodput.breakdown` reading ``entries`` runs."""
    count = 0

    def trace(frame, event, arg):
        nonlocal count
        if frame.f_code.co_filename != breakdown_module.__file__:
            return None
        count += event == "line"
        return trace

    sys.settrace(trace)
    try:
        breakdown(entries)
    finally:
        sys.settrace(None)
    return count


@pytest.mark.parametrize("live", [False, True], ids=["checkpoint", "live"])
def test_reading_the_ledger_takes_lines_linear_in_its_length_whatever_its_faults(live):
    """Twice the lines and twice the faults: twice the work, not four times (every fault
    once scanned every rank-0 line, every resume every kept work line, every live
    recovery every rank-0 line and fault)."""
    small, large = (_lines_run(long_ledger(days * 86400.0 / 8, faults=days * 40, live=live))
                    for days in (1, 2))
    assert large / small < 2.1, (small, large)


class SlowLedger:
    """A ledger file whose every write takes ``delay_s`` (a store in an outage), or until
    ``released`` is set."""

    fs, path = fsspec.filesystem("memory"), "/slow/goodput/rank0.jsonl"

    def __init__(self, delay_s: float = 0.0):
        self.delay_s = delay_s
        self.released = threading.Event()
        self.lines: list[dict] = []

    def append(self, *entries):
        self.released.wait(self.delay_s or None)
        self.lines += entries


def test_rank_0s_ledger_lines_never_hold_its_training_thread():
    """Three checkpoint reports on a store taking 0.5 s a write: the reports do not wait
    for it; the attempt's end does, and every line is written, in order."""
    ledger = SlowLedger(delay_s=0.5)
    clock = AttemptClock(RunHistory(), 0, ledger=ledger)
    started = time.monotonic()
    clock.ready(time.time(), restored_iteration=None)
    for iteration in range(1, 4):
        numbers = clock.shared_numbers()
        clock.waited()
        clock.report_ends([[n] for n in numbers], any_checkpoint=True, iteration=iteration)
    assert time.monotonic() - started < 0.25
    clock.finish(0.0, 3)
    assert [(e["event"], e.get("iteration")) for e in ledger.lines] == [
        ("attempt", None), ("work", 1), ("work", 2), ("work", 3), ("work", 3)]


def test_a_ledger_far_behind_its_store_drops_its_oldest_lines_with_one_warning(caplog):
    ledger = SlowLedger()  # blocked until released
    queued = QueuedLedger(ledger, max_queued=3)
    queued.append({"n": 0})  # taken by the thread, which then waits on the store
    assert not queued.flush(0.1)
    with caplog.at_level(logging.WARNING):
        for n in range(1, 6):
            queued.append({"n": n})
    [warning] = [r.message for r in caplog.records]
    assert "3 lines behind" in warning
    ledger.released.set()
    assert queued.flush(5.0)
    assert [e["n"] for e in ledger.lines] == [0, 3, 4, 5]


def test_a_live_recovery_keeps_the_work_up_to_the_copy_it_went_on_from():
    """As RUN, but attempt 2 goes on from a survivor's copy of the step taken at 109.2, at
    report 2: the work from rank 0's last line (108) to the copy is kept, only the 0.3 s
    from the copy to the failure are lost, and iteration 2 of attempt 1 is kept too."""
    live = live_run(109.2)
    goodput = breakdown(live)
    assert goodput.seconds[Cause.RECOMPUTE] == pytest.approx(0.3)
    assert goodput.seconds[Cause.PRODUCTIVE] == pytest.approx(1.5 + 1.8 + 1.2 + 1.7)
    assert goodput.seconds[Cause.RESTORE] == pytest.approx(1.0)  # a live recovery restores
    assert sum(goodput.seconds.values()) == pytest.approx(goodput.wall_s) == 16.0
    assert breakdown(list(reversed(live))) == goodput
    assert goodput.live_recoveries == 1 and goodput.describe().endswith(
        "; 1 of 1 recoveries live (from memory)")


def test_a_live_copy_older_than_rank_0s_last_line_adds_nothing():
    """A copy taken before rank 0's last line (a report after the step): that line already
    accounts for the time; only what came after it is lost."""
    goodput = breakdown(live_run(107.0))
    assert goodput.seconds[Cause.RECOMPUTE] == pytest.approx(1.5)
    assert sum(goodput.seconds.values()) == pytest.approx(goodput.wall_s)


def test_a_live_copy_stamped_after_the_failure_keeps_the_work_up_to_the_failure():
    """The survivor's copy is stamped by its own clock, which can read a moment after the
    failed rank's: the work is kept up to the failure, none of it is lost."""
    goodput = breakdown(live_run(109.6))
    assert goodput.seconds[Cause.RECOMPUTE] == pytest.approx(0.0)
    assert sum(goodput.seconds.values()) == pytest.approx(goodput.wall_s)
