"""Straggler detection under fit(): two real workers, one of them slow before each report
(``slow_rank`` in the deterministic job), is named in the metric rows the callbacks get,
in run.json, on the console and in ``elastic-train show``; without the sleep nobody is."""

from __future__ import annotations

import json
import logging
import os
import subprocess

import pytest

import elastic_train as et
from elastic_train.storage import RunStorage
from tests.conftest import EPOCHS, fit
from tests.support.launched import CLI, show
from tests.support.paths import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240),
              pytest.mark.usefixtures("no_leaked_processes")]

WATCH = et.StragglerConfig(window=3)  # 5 reports a run: 3 in a row name a node


class Rows(et.UserCallback):
    def __init__(self):
        self.rows = []

    def after_report(self, run_context, metrics, checkpoint):
        self.rows += metrics


def test_a_slow_rank_is_named_and_a_steady_run_names_nobody(storage_path, caplog):
    caplog.set_level(logging.WARNING, logger="elastic_train.driver.run_monitor")
    rows = Rows()
    fit(storage_path, "slow", callbacks=[rows], straggler_config=WATCH,
        config={"slow_rank": {"rank": 1, "sleep_s": 0.6}, "mark_steps": True})
    assert len(rows.rows) == EPOCHS
    assert all(r["slowest_rank"] == 1 and r["slowest_node"] == 0
               and r["slowest_rank_score"] >= 1.5 for r in rows.rows), rows.rows
    # per step() marker: 6 steps a report, the 0.6 s sleep is 0.1 s a step
    assert all(r["step_time_s"] < 0.1 for r in rows.rows), rows.rows
    [straggler] = RunStorage.open(storage_path, "slow").read_run_state().stragglers
    assert (straggler.node, straggler.rank, straggler.since_iteration) == (0, 1, 1)
    assert "Straggler: node 0 (rank 1) steps" in caplog.text
    text = show(storage_path, "slow")
    assert "stragglers: 1" in text and "node 0 (rank 1) steps" in text, text
    assert "slowest rank 1 on node 0" in text, text
    assert json.loads(show(storage_path, "slow", "--json"))["stragglers"][0]["rank"] == 1

    caplog.clear()
    steady = Rows()
    fit(storage_path, "steady", callbacks=[steady], straggler_config=WATCH)
    assert len(steady.rows) == EPOCHS and all("slowest_rank_score" in r for r in steady.rows)
    assert RunStorage.open(storage_path, "steady").read_run_state().stragglers == []
    assert "Straggler" not in caplog.text
    assert "stragglers: 0" in show(storage_path, "steady")


def test_launch_flags_name_a_slow_rank(storage_path, tmp_path):
    """Under ``elastic-train launch`` the straggler flags set the watch: with
    ``--straggler-window 2``, rank 1 of a script that sleeps 0.4 s more per epoch there is
    named on the console and in run.json."""
    launched = subprocess.run(
        [*CLI, "launch", "--nproc-per-node", "2", "--straggler-window", "2",
         "--straggler-threshold", "1.5", "--storage-path", storage_path, "--name", "slow",
         os.path.join(REPO, "tests", "e2e", "scripts", "launch_script.py"), str(tmp_path), "5",
         "--slow-rank", "1:0.4"],
        cwd=REPO, capture_output=True, text=True, timeout=180)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert "Straggler: node 0 (rank 1) steps" in launched.stderr, launched.stderr
    state = RunStorage.open(storage_path, "slow").read_run_state()
    [straggler] = state.stragglers
    assert (straggler.node, straggler.rank) == (0, 1)
    assert state.spec["launch"]["straggler_window"] == 2
