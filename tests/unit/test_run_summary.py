"""Unit tests: matching failures with restarts, and goodput."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from elastic_train.cli.run_summary import RunSummary, recoveries
from elastic_train.storage.run_state import FailureRecord, RestoreRecord


def test_each_failure_gets_the_first_restart_after_it():
    failures = [FailureRecord.from_json(f) for f in [
        {"time": 10.0, "failed_at": 9.5, "rendezvous_at": 11.0, "kind": "failure"},
        {"time": 30.0, "failed_at": 30.0, "kind": "preemption"}]]  # no rendezvous yet
    restores = [RestoreRecord.from_json(r) for r in [
        {"time": 5.0, "restored_iteration": 0, "recomputed_iterations": 1,
         "recomputed_s": 2.0},  # a relaunch
        {"time": 14.0, "restored_iteration": 3, "recomputed_iterations": 2,
         "recomputed_s": 3.0}]]
    first, second = (asdict(r) for r in recoveries(failures, restores))
    assert first == {"kind": "failure", "detect_s": 0.5, "rendezvous_s": 1.0, "restore_s": 3.0,
                     "recomputed_iterations": 2, "recomputed_s": 3.0}
    assert second["kind"] == "preemption" and second["rendezvous_s"] is None
    assert second["restore_s"] is None and second["recomputed_iterations"] is None


def test_goodput_is_kept_training_over_wall_clock():
    summary = RunSummary([], None, None, 5, [], train_s=45.0, wall_s=60.0)
    assert summary.goodput == pytest.approx(0.75)
    assert RunSummary([], None, None, 0, []).goodput is None


def test_show_gives_each_checkpoint_its_size_and_ranks():
    from elastic_train.cli import render
    from elastic_train.storage import CommitManifest
    from elastic_train.storage.run_state import RunState

    files = {f"__{r}_0.distcp": {"size": 1 << 20, "crc32": "0", "rank": r} for r in range(4)}
    checkpoint = CommitManifest(7, 3, {"loss": 0.5}, files, world_size=4)
    summary = RunSummary([checkpoint], checkpoint, None, 3, [])
    [line] = [x for x in render.checkpoint_lines(summary) if x.startswith("* checkpoint_")]
    assert "iteration 3  4.0 MiB from ranks 0-3  {'loss': 0.5}" in line
    state = RunState.from_json({"status": "running"})
    [shown] = json.loads(render.run_json(state, summary))["checkpoints"]
    assert (shown["ranks"], shown["size_bytes"]) == ([0, 1, 2, 3], 4 << 20)


def test_show_gives_the_latest_step_times_and_the_stragglers():
    from elastic_train.cli import render
    from elastic_train.storage.run_state import RunState
    from elastic_train.stragglers import Straggler, step_fields

    state = RunState.from_json({"status": "running", "stragglers": [
        Straggler(node=1, rank=3, score=2.5, since_iteration=4, since=0.0).to_json()]})
    summary = RunSummary([], None, None, 9, [],
                         step_times=step_fields([0.2, 0.2, 0.2, 0.5], [0, 0, 1, 1]))
    lines = render.step_lines(state, summary)
    assert lines[0] == ("steps:    0.2 s median at the latest report; "
                        "slowest rank 3 on node 1: 2.50x")
    assert lines[1] == "stragglers: 1"
    assert "node 1 (rank 3) steps 2.5x slower than the median since iteration 4" in lines[2]
    assert json.loads(render.run_json(state, summary))["stragglers"][0]["node"] == 1


def test_show_gives_each_checkpoints_validation_status():
    from elastic_train.cli import render
    from elastic_train.storage import CommitManifest
    from elastic_train.storage.run_state import RunState

    validated = CommitManifest(1, 2, {"val": 0.9}, {}, world_size=1,
                               validation={"status": "VALIDATED", "task": {}})
    plain = CommitManifest(2, 3, {"loss": 0.5}, {}, world_size=1)
    summary = RunSummary([validated, plain], None, None, 3, [])
    first, second = [x for x in render.checkpoint_lines(summary) if "checkpoint_" in x]
    assert first.endswith("{'val': 0.9}  VALIDATED") and second.endswith("{'loss': 0.5}")
    shown = json.loads(render.run_json(RunState.from_json({"status": "running"}),
                                       summary))["checkpoints"]
    assert [c["validation"] for c in shown] == ["VALIDATED", None]
