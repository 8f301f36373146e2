"""Live recovery with real workers: a fault rolls back to the last completed step, held in
the survivors' memory; a replaced rank receives it from a survivor; nothing is read from
storage (these runs report no checkpoint at all unless a test asks), and the final
weights are bit-identical to an uninterrupted run's, every sample trained on once per
epoch."""

from __future__ import annotations

import json
import os

import cloudpickle
import pytest

import elastic_train as et
from elastic_train.goodput.breakdown import Cause
from elastic_train.torch import TorchTrainer
from tests.support import live_jobs
from tests.support.ledger_account import assert_adds_up

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180),
              pytest.mark.usefixtures("no_leaked_processes")]
cloudpickle.register_pickle_by_value(live_jobs)

EPOCHS = 3
STEPS_PER_EPOCH = live_jobs.ROWS // 16


def fit_live(storage_path, name, tmp_path, faults=(), stateful_faults=(), max_failures=3,
             **config):
    return TorchTrainer(
        live_jobs.train_live,
        train_loop_config={"epochs": EPOCHS, "faults": list(faults),
                           "stateful_faults": list(stateful_faults),
                           "starts_file": str(tmp_path / "starts"), **config},
        scaling_config=et.ScalingConfig(num_workers=2),
        run_config=et.RunConfig(storage_path=storage_path, name=name,
                                failure_config=et.FailureConfig(max_failures=max_failures)),
    ).fit()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    path = tmp_path_factory.mktemp("live-baseline")
    return fit_live(str(path / "results"), "baseline", path).return_value


def fault(tmp_path, rank, how, epoch, batch, tag=""):
    return {"rank": rank, "epoch": epoch, "batch": batch, "how": how,
            "marker": str(tmp_path / f"marker-{rank}-{how}-{epoch}-{batch}{tag}")}


def starts(tmp_path) -> list[int]:
    return [int(s) for s in (tmp_path / "starts").read_text().split()]


def assert_kept_every_step(result, uninterrupted, tmp_path, expected_starts):
    """Bit-identical to the uninterrupted run, each sample once per epoch, the attempts
    starting where the faults left them, and no checkpoint in storage to have read."""
    value = result.return_value
    assert value["digest"] == uninterrupted["digest"]
    assert value["visits"] == [[1] * live_jobs.ROWS] * EPOCHS
    assert value["steps"] == value["seen"] == EPOCHS * STEPS_PER_EPOCH
    assert starts(tmp_path) == expected_starts
    assert not [d for d in os.listdir(result.path) if d.startswith("checkpoint_")]


def test_the_uninterrupted_run_counts_every_sample_once(uninterrupted):
    assert uninterrupted["visits"] == [[1] * live_jobs.ROWS] * EPOCHS
    assert uninterrupted["steps"] == EPOCHS * STEPS_PER_EPOCH


def test_a_raise_keeps_the_survivors_last_step(storage_path, tmp_path, uninterrupted):
    result = fit_live(storage_path, "raise", tmp_path, [fault(tmp_path, 1, "raise", 1, 3)])
    assert_kept_every_step(result, uninterrupted, tmp_path, [0, STEPS_PER_EPOCH + 3])
    with open(os.path.join(result.path, "run.json")) as f:
        [failure] = json.load(f)["failures"]
    assert failure["restart"] == "in-process"


def test_a_sigkilled_rank_gets_the_state_from_a_survivor(storage_path, tmp_path,
                                                          uninterrupted):
    result = fit_live(storage_path, "sigkill", tmp_path, [fault(tmp_path, 1, "sigkill", 1, 2)])
    assert_kept_every_step(result, uninterrupted, tmp_path, [0, STEPS_PER_EPOCH + 2])
    with open(os.path.join(result.path, "run.json")) as f:
        [failure] = json.load(f)["failures"]
    assert failure["replaced"] == {"1": "its process ended"}


def test_rank_0_dies_and_rank_1_hands_the_state_over(storage_path, tmp_path, uninterrupted):
    result = fit_live(storage_path, "rank0", tmp_path, [fault(tmp_path, 0, "exit", 0, 4)])
    assert_kept_every_step(result, uninterrupted, tmp_path, [0, 4])


def test_two_faults_back_to_back(storage_path, tmp_path, uninterrupted):
    """The second fault comes at the second step after the first recovery (its first step
    redoes the one the first fault interrupted), on the other rank, which was the source."""
    result = fit_live(storage_path, "twice", tmp_path, [fault(tmp_path, 1, "sigkill", 2, 1),
                                                        fault(tmp_path, 0, "raise", 2, 2)])
    assert_kept_every_step(result, uninterrupted, tmp_path,
                           [0, 2 * STEPS_PER_EPOCH + 1, 2 * STEPS_PER_EPOCH + 2])


def test_a_fault_inside_step_done_falls_back_to_a_whole_copy(storage_path, tmp_path,
                                                             uninterrupted):
    """Rank 1 fails while its copy of step 8 is being taken: it holds no copy then, and
    rank 0's copy of step 8 is whole (another rank's failure waits for the copy's end)."""
    where = {"where": "state_dict", "rank": 1, "after": 8, "how": "raise",
             "marker": str(tmp_path / "marker-state-dict")}
    result = fit_live(storage_path, "in-step-done", tmp_path, stateful_faults=[where])
    assert_kept_every_step(result, uninterrupted, tmp_path, [0, 8])


def test_a_fault_during_the_transfer_is_recovered_from_again(storage_path, tmp_path,
                                                             uninterrupted):
    """Rank 1 raises, survives in its process, and is SIGKILLed while it loads the state of
    the recovery; its replacement receives the state again from rank 0."""
    loading = {"where": "load", "rank": 1, "after": 0, "how": "sigkill",
               "marker": str(tmp_path / "marker-load")}
    result = fit_live(storage_path, "in-transfer", tmp_path,
                      [fault(tmp_path, 1, "raise", 1, 1)], stateful_faults=[loading])
    assert_kept_every_step(result, uninterrupted, tmp_path,
                           [0, STEPS_PER_EPOCH + 1, STEPS_PER_EPOCH + 1])


def test_no_holder_falls_back_to_the_checkpoint(storage_path, tmp_path, uninterrupted):
    """restart_in_process=False starts every worker anew: nobody holds a state, so the
    latest checkpoint LiveState.checkpoint() wrote is loaded (its step, its data)."""
    result = TorchTrainer(
        live_jobs.train_live,
        train_loop_config={"epochs": EPOCHS, "checkpoint_every_epoch": True,
                           "faults": [fault(tmp_path, 1, "raise", 1, 3)],
                           "starts_file": str(tmp_path / "starts")},
        scaling_config=et.ScalingConfig(num_workers=2),
        run_config=et.RunConfig(storage_path=storage_path, name="fallback",
                                failure_config=et.FailureConfig(
                                    max_failures=1, restart_in_process=False)),
    ).fit()
    assert result.return_value["digest"] == uninterrupted["digest"]
    assert result.return_value["visits"][0] == [1] * live_jobs.ROWS
    assert starts(tmp_path) == [0, STEPS_PER_EPOCH]  # epoch 0's checkpoint


def test_the_ledger_tells_a_live_recovery_apart(storage_path, tmp_path, uninterrupted):
    result = fit_live(storage_path, "ledger", tmp_path, [fault(tmp_path, 1, "raise", 2, 2)])
    lines = [json.loads(line) for name in os.listdir(os.path.join(result.path, "goodput"))
             for line in open(os.path.join(result.path, "goodput", name))]
    [live] = [line for line in lines if line["event"] == "live"]
    assert live["step"] == 2 * STEPS_PER_EPOCH + 2 and live["source_rank"] in (0, 1)
    assert result.goodput.failures == result.goodput.live_recoveries == 1
    assert result.goodput.seconds[Cause.RECOMPUTE] < 1.0
    assert_adds_up(result.goodput)
