"""The goodput ledger on real runs beyond CI's one (tests/e2e/test_observe.py): a raised
fault's lost work is recompute; the ledger survives a SIGKILLed driver and its restore.
Long profile: ``python -m pytest -m long tests/e2e/test_goodput_ledger.py``."""

from __future__ import annotations

import os
import signal

import pytest

from elastic_train.goodput.breakdown import Cause
from elastic_train.torch import TorchTrainer
from tests.conftest import fit, start_driver, stop_driver_after_commit
from tests.support.ledger_account import assert_adds_up

pytestmark = [pytest.mark.e2e, pytest.mark.long, pytest.mark.timeout(300),
              pytest.mark.usefixtures("no_leaked_processes")]


def test_a_raised_faults_lost_work_is_recompute(storage_path, tmp_path):
    """Rank 1 raises in epoch 2 (batch 3): the epoch's batches since its last checkpoint
    (ASYNC, epoch 1's) are lost, and the time to the fault is recompute."""
    fault = {"rank": 1, "epoch": 2, "batch": 3, "how": "raise", "marker": str(tmp_path / "m")}
    result = fit(storage_path, "raised", max_failures=1, config={"fault": fault})
    goodput = result.goodput
    assert_adds_up(goodput)
    assert goodput.failures == 1 and goodput.seconds[Cause.RECOMPUTE] > 0, goodput
    assert goodput.attempts[0].seconds[Cause.RECOMPUTE] > 0  # charged to the failed attempt


def test_the_ledger_survives_a_killed_driver_and_its_restore(storage_path, tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    driver = start_driver(storage_path, "killed", pids)
    stop_driver_after_commit(driver, os.path.join(storage_path, "killed"), 2, signal.SIGKILL)
    run_path = os.path.join(storage_path, "killed")
    goodput = TorchTrainer.restore(run_path).fit().goodput
    assert_adds_up(goodput)
    assert len(goodput.attempts) == 2  # one per launch: the lost driver's, the restore's
    first, second = goodput.attempts
    assert first.seconds[Cause.PRODUCTIVE] > 0 and second.seconds[Cause.RESTORE] > 0
    assert second.seconds[Cause.STARTUP] > 0
