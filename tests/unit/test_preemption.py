"""Unit tests: preemption notices, and which budget a failed attempt spends."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import pytest
from torch.distributed.elastic.agent.server.api import RunResult, WorkerState
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

import elastic_train as et
from elastic_train._internal import env_vars
from elastic_train._internal.failure_kinds import FailureKind
from elastic_train.agent.local_agent import TrainAgent
from elastic_train.agent.options import AgentOptions
from elastic_train.agent.restart_budget import RestartBudget
from elastic_train.worker import preemption


def test_agree_merges_every_ranks_notice(monkeypatch):
    monkeypatch.setenv(env_vars.PREEMPTION_GRACE_S, "10")
    assert preemption.agree([None, None]) is None
    info = preemption.agree([None, (11, "b", 100.0), (12, "a", 99.0)])
    assert info == et.PreemptionInfo(ranks=(1, 2), hostnames=("a", "b"), deadline=109.0)


@pytest.mark.parametrize("grace,second_kills", [("0", True), ("60", False)])
def test_sigterm_is_a_notice_and_another_one_kills_only_after_the_grace(
        monkeypatch, grace, second_kills):
    """The scheduler's SIGTERM and the one the agent passes on are one notice."""
    killed = []
    monkeypatch.setenv(env_vars.PREEMPTION_GRACE_S, grace)
    monkeypatch.setattr(preemption, "_noticed_at", None)
    monkeypatch.setattr(preemption.os, "kill", lambda pid, sig: killed.append(sig))
    saved = signal.getsignal(signal.SIGTERM)
    try:
        preemption.install()
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)
        assert preemption.local_notice()[0] == os.getpid()
        assert killed == []
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)
        assert killed == ([signal.SIGTERM] if second_kills else [])
    finally:
        signal.signal(signal.SIGTERM, saved)


def test_marks_are_cleared_per_incarnation(tmp_path, monkeypatch):
    notice_dir = str(tmp_path / "notices")
    preemption.clear(notice_dir)
    assert not preemption.marked(notice_dir)
    monkeypatch.setenv(env_vars.PREEMPTION_DIR, notice_dir)
    preemption.leave_mark(3)
    assert preemption.marked(notice_dir)
    preemption.clear(notice_dir)
    assert not preemption.marked(notice_dir)


@pytest.mark.parametrize("kwargs,fragment", [
    ({"max_preemption_failures": -2}, "max_preemption_failures=-2"),
    ({"preemption_grace_s": -1}, "preemption_grace_s=-1"),
])
def test_failure_config_rejects_bad_preemption_settings(kwargs, fragment):
    with pytest.raises(et.ConfigError, match=fragment):
        et.FailureConfig(**kwargs)


def _agent(notice_dir: str | None) -> TrainAgent:
    agent = TrainAgent.__new__(TrainAgent)  # only the failure classification is exercised
    agent.options = AgentOptions(notice_dir=notice_dir)
    return agent


def _failed(message: str) -> RunResult:
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file="/nonexistent")
    failure.message = message
    return RunResult(state=WorkerState.FAILED, failures={0: failure})


def test_on_a_single_node_every_failure_is_charged():
    group = SimpleNamespace(group_world_size=1)
    failed = _failed("ConnectionRefusedError: Connection refused")
    assert _agent(None)._classify(group, failed) == FailureKind.FAILURE


def test_preemption_spends_its_own_budget(tmp_path, monkeypatch):
    notice_dir = str(tmp_path / "n")
    preemption.clear(notice_dir)
    monkeypatch.setenv(env_vars.PREEMPTION_DIR, notice_dir)
    preemption.leave_mark(0)
    group = SimpleNamespace(group_world_size=1)
    assert _agent(notice_dir)._classify(group, _failed("killed")) == FailureKind.PREEMPTION
    budget = RestartBudget(max_failures=0, max_preemptions=1)
    first = budget.charge(FailureKind.PREEMPTION)
    assert first.restart and not first.preemption_budget_spent
    second = budget.charge(FailureKind.PREEMPTION)
    assert not second.restart and second.preemption_budget_spent


def test_surviving_reports_live_workers_and_ignores_dead_ones():
    """Teardown's last check: what even SIGKILL did not end is named with its state."""
    import subprocess

    from elastic_train.agent.worker_slots import surviving

    proc = subprocess.Popen(["sleep", "30"])
    try:
        assert surviving([proc.pid], wait_s=0.1) == {proc.pid: "S"}
    finally:
        proc.kill()
    assert surviving([proc.pid], wait_s=2) == {}  # a zombie until reaped: gone
    proc.wait()
    assert surviving([proc.pid, 2**22 + 7], wait_s=0) == {}


def test_a_notice_is_forgotten_by_the_next_attempt_once_its_grace_is_over(monkeypatch):
    """#24, item 9: after an in-process restart an expired notice is not announced again
    (every checkpoint SYNC, every failure charged to preemption), and a new SIGTERM is a
    new notice, not a kill."""
    now = [1000.0]
    killed = []
    monkeypatch.setenv(env_vars.PREEMPTION_GRACE_S, "30")
    monkeypatch.setattr(preemption, "_noticed_at", None)
    monkeypatch.setattr(preemption.time, "time", lambda: now[0])
    monkeypatch.setattr(preemption.os, "kill", lambda pid, sig: killed.append(sig))
    saved = signal.getsignal(signal.SIGTERM)
    try:
        preemption.install()  # attempt 0
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)
        now[0] += 10
        preemption.install()  # attempt 1 within the grace: the node is still going
        assert preemption.local_notice()[2] == 1000.0
        now[0] += 60
        preemption.install()  # attempt 2, the grace long over
        assert preemption.local_notice() is None
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)  # a new notice
        assert killed == [] and preemption.local_notice()[2] == 1070.0
    finally:
        signal.signal(signal.SIGTERM, saved)
