"""Unit tests: matching failures with restarts, and goodput."""

from __future__ import annotations

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
