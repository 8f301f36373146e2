"""Unit tests: what the agent makes of its workers' records and exits during in-process
restarts (fakes stand in for torch's worker group and process context)."""

from __future__ import annotations

import math
import os
from types import SimpleNamespace

import pytest

from elastic_train.agent.failures import Cause, Observed
from elastic_train.agent.inprocess import restarts as inprocess
from elastic_train.agent.inprocess.restarts import FailedAttempt, InProcessRestarts, Seen
from elastic_train.errors import WorkerFailure
from elastic_train.worker.inprocess import channel
from elastic_train.worker.inprocess.channel import FailureNote, Stage, WorkerRecord


def group(ranks: int = 2) -> SimpleNamespace:
    workers = [SimpleNamespace(local_rank=r, global_rank=r, id=100 + r) for r in range(ranks)]
    return SimpleNamespace(workers=workers, group_world_size=1, group_rank=0)


def context(exits: dict[int, int | None]) -> SimpleNamespace:
    return SimpleNamespace(subprocess_handlers={
        r: SimpleNamespace(proc=SimpleNamespace(poll=lambda code=code: code))
        for r, code in exits.items()})


def died(worker, exitcode: int) -> Observed:
    return Observed(WorkerFailure(rank=worker.global_rank, local_rank=worker.local_rank,
                                  pid=worker.id, exitcode=exitcode, message="",
                                  traceback=None), Cause.OWN, math.inf)


@pytest.fixture
def restarts(tmp_path) -> InProcessRestarts:
    agent = InProcessRestarts(str(tmp_path), 10.0, replace=lambda *_: 0, failure_of=died)
    agent.begin(restart_count=0)
    return agent


def note(primary: bool) -> FailureNote:
    return FailureNote("RuntimeError: x", "Traceback ...", primary, 1.0)


def record(restarts, rank: int, attempt: int, stage: Stage, failure=None) -> None:
    channel.write_record(restarts.directory, rank, WorkerRecord(attempt, stage, 200 + rank,
                                                                failure))


def test_running_workers_that_can_restart_in_process(restarts):
    for rank in (0, 1):
        record(restarts, rank, 0, Stage.RUNNING)
    assert restarts.poll(group(), context({0: None, 1: None})).seen is Seen.RUNNING


def test_a_worker_without_a_record_leaves_it_to_torch(restarts):
    record(restarts, 0, 0, Stage.RUNNING)
    assert restarts.poll(group(), context({0: None, 1: None})).seen is Seen.TORCH
    assert restarts.poll(group(), context({0: 0, 1: 0})).seen is Seen.TORCH  # all done


def test_a_death_is_the_root_cause(restarts):
    record(restarts, 0, 0, Stage.FAILED, note(primary=False))  # its collective broke
    record(restarts, 1, 0, Stage.RUNNING)
    seen = restarts.poll(group(), context({0: None, 1: -9})).failed
    assert isinstance(seen, FailedAttempt) and seen.primary
    assert [f.rank for f in seen.failures] == [1, 0]


def test_uploads_are_finished_before_a_restart_only_while_every_worker_lives(restarts):
    """A raised error leaves every process alive: the verdict lets the workers finish the
    uploads they reported (half the unwind timeout); a death, here or announced by
    another node, drops them (its share of the checkpoint can never come)."""
    for rank, stage in ((0, Stage.FAILED), (1, Stage.RUNNING)):
        channel.write_record(restarts.directory, rank, WorkerRecord(
            0, stage, os.getpid(), note(primary=True) if stage is Stage.FAILED else None))
    raised = restarts.poll(group(), context({0: None, 1: None})).failed
    assert raised.all_alive
    killed = restarts.poll(group(), context({0: None, 1: -9})).failed
    assert not killed.all_alive
    remote = FailedAttempt(0, [], False, died(group().workers[1], -9).failure)
    assert not remote.all_alive
    workers = group()
    workers.spec = SimpleNamespace(rdzv_handler=SimpleNamespace(use_agent_store=True))
    for failed, finish_s in ((raised, 5.0), (killed, 0.0)):
        attempt = restarts.attempt
        for rank in (0, 1):
            record(restarts, rank, attempt + 1, Stage.READY)
        recovery = restarts.recover(workers, context({0: None, 1: None}), failed, lambda: False)
        assert recovery is not None and recovery.replaced == {}
        assert channel.wait_for_verdict(restarts.directory, attempt) == \
            channel.Verdict(attempt, True, finish_s)


def test_broken_collectives_alone_wait_for_the_failure_behind_them(restarts, monkeypatch):
    record(restarts, 0, 0, Stage.FAILED, note(primary=False))
    record(restarts, 1, 0, Stage.RUNNING)
    assert restarts.poll(group(), context({0: None, 1: None})).seen is Seen.RUNNING  # in the grace
    monkeypatch.setattr(inprocess, "SECONDARY_GRACE_S", 0.0)
    seen = restarts.poll(group(), context({0: None, 1: None})).failed
    assert isinstance(seen, FailedAttempt) and not seen.primary


def test_a_raised_error_waits_briefly_for_a_death_behind_it(restarts):
    """gloo reports a dead peer as a plain RuntimeError, also out of backward(): the
    SIGKILLed peer, once its death shows, is the root cause."""
    record(restarts, 0, 0, Stage.FAILED, note(primary=True))
    record(restarts, 1, 0, Stage.RUNNING)
    assert restarts.poll(group(), context({0: None, 1: None})).seen is Seen.RUNNING  # in the grace
    seen = restarts.poll(group(), context({0: None, 1: -9})).failed
    assert isinstance(seen, FailedAttempt) and [f.rank for f in seen.failures] == [1, 0]


def test_a_raised_error_is_acted_on_at_once_when_no_death_can_explain_it(restarts):
    """One node, every worker's process running: no death is on its way, so the 0.3 s
    grace is not spent (figure 4's exception row)."""
    for rank, stage in ((0, Stage.FAILED), (1, Stage.RUNNING)):
        channel.write_record(restarts.directory, rank, WorkerRecord(
            0, stage, os.getpid(), note(primary=True) if stage is Stage.FAILED else None))
    seen = restarts.poll(group(), context({0: None, 1: None})).failed
    assert isinstance(seen, FailedAttempt) and [f.rank for f in seen.failures] == [0]


def test_a_raised_error_waits_while_a_workers_process_has_ended_unseen(restarts):
    """The process ended (here: never existed) but its client still runs: wait."""
    record(restarts, 0, 0, Stage.FAILED, note(primary=True))
    channel.write_record(restarts.directory, 1, WorkerRecord(0, Stage.RUNNING, 2**22 + 7))
    assert restarts.poll(group(), context({0: None, 1: None})).seen is Seen.RUNNING


def test_the_last_attempts_failure_is_not_the_next_ones(restarts, monkeypatch):
    """After the go for attempt 1, a worker still 'ready' carries attempt 0's error."""
    monkeypatch.setattr(inprocess, "RAISED_GRACE_S", 0.0)
    restarts.attempt = 1
    record(restarts, 0, 1, Stage.READY, note(primary=True))
    record(restarts, 1, 1, Stage.RUNNING)
    assert restarts.poll(group(), context({0: None, 1: None})).seen is Seen.RUNNING
    record(restarts, 0, 1, Stage.FAILED, note(primary=True))  # attempt 1 failed
    assert isinstance(restarts.poll(group(), context({0: None, 1: None})).failed, FailedAttempt)


def test_an_unhealthy_device_is_a_failure_of_the_attempt(restarts, monkeypatch):
    monkeypatch.setattr(inprocess, "RAISED_GRACE_S", 0.0)
    record(restarts, 0, 1, Stage.UNHEALTHY)
    record(restarts, 1, 0, Stage.RUNNING)
    seen = restarts.poll(group(), context({0: None, 1: None})).failed
    assert isinstance(seen, FailedAttempt)
    assert "unhealthy" in seen.failures[0].message


def test_a_new_world_clears_the_old_records_and_refills_only_dead_slots(tmp_path):
    """After a membership change: the old world's records go, the live workers keep their
    processes and get their ranks through the go, a dead slot gets a new process."""
    started: list[tuple[int, dict]] = []
    restarts = InProcessRestarts(str(tmp_path), 10.0, failure_of=died,
                                 replace=lambda w, env: started.append((w.local_rank, env)))
    restarts.begin(restart_count=0)
    restarts.attempt = 4
    record(restarts, 0, 5, Stage.READY, note(primary=False))
    workers = [SimpleNamespace(local_rank=r, global_rank=2 + r) for r in (0, 1)]
    new_group = SimpleNamespace(workers=workers, master_port=29600)
    processes = context({0: None, 1: -9})
    processes.envs = {0: {"RANK": "0"}, 1: {"RANK": "1"}}
    world = channel.NewWorld("g2", 1, 2, 2, 4, 2, 4, "node0")
    recovery = restarts.reform(new_group, processes, world, restart_count=2)
    assert recovery.attempt == 0 and recovery.replaced == {3: "its process ended"}
    assert channel.read_record(restarts.directory, 0) is None  # no stale failure
    assert channel.read_go(restarts.directory) == channel.Go(0, 2, 29600, world)
    assert [lr for lr, _ in started] == [1] and started[0][1]["RANK"] == "3"
    assert processes.envs[0]["RANK"] == "2"  # what a later replacement starts with
    assert restarts.attempt == 0
