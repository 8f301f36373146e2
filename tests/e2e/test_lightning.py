"""Ray's PyTorch Lightning guide with the imports changed (examples/lightning_digits.py)
on 2 workers: a worker SIGKILLed from outside mid-run, then Lightning resumes with
trainer.fit(ckpt_path=...) from get_checkpoint() and finishes the remaining epochs."""

from __future__ import annotations

import json
import os
import signal
import threading

import pytest

import elastic_train as et
from elastic_train.torch import TorchTrainer
from tests.conftest import wait_until
from tests.support.examples import first_attempt, load_example, wait_for_kill

pytest.importorskip("pytorch_lightning")
pytest.importorskip("sklearn")

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240),
              pytest.mark.usefixtures("no_leaked_processes")]

EPOCHS = 4


def hold_rank0_after_epoch(example, epoch: int, marker: str, pid_file: str):
    """A Lightning callback (of the example's Lightning package) that, in the first
    attempt only, parks rank 0 after ``epoch``'s report until the test kills it."""

    class HoldForKill(example.pl.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            if trainer.current_epoch == epoch and trainer.global_rank == 0 \
                    and first_attempt(marker):
                wait_for_kill(pid_file)

    return HoldForKill()


def test_lightning_guide_survives_a_sigkill_and_resumes(tmp_path):
    example = load_example("lightning_digits")
    pid_file = tmp_path / "pid"

    def killer():
        if wait_until(lambda: pid_file.exists(), 180):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    hold = hold_rank0_after_epoch(example, 1, str(tmp_path / "held"), str(pid_file))
    result = TorchTrainer(
        example.train_func,
        train_loop_config={"epochs": EPOCHS, "lr": 3e-3, "callbacks": [hold]},
        scaling_config=et.ScalingConfig(num_workers=2),
        run_config=et.RunConfig(storage_path=str(tmp_path / "results"), name="lightning",
                                failure_config=et.FailureConfig(max_failures=1)),
    ).fit()
    thread.join(5)

    with open(os.path.join(result.path, "run.json")) as f:
        [failure] = json.load(f)["failures"]
    assert failure["workers"][0]["rank"] == 0 and failure["workers"][0]["signal"] == "SIGKILL"
    rows = result.metrics_dataframe
    # Every epoch reported once, in order, though the first attempt died after epoch 1:
    # Lightning restored its loops (epoch, global step) and the optimizer from the checkpoint.
    assert rows["training_iteration"].tolist() == list(range(1, EPOCHS + 1))
    assert rows["epoch"].tolist() == list(range(EPOCHS))
    steps = rows["step"].tolist()
    assert steps == [steps[0] * (i + 1) for i in range(EPOCHS)]
    resumed = rows[rows["iterations_since_restore"] < rows["training_iteration"]]
    assert len(resumed) >= EPOCHS - 2  # the rows after the restart came from a restore
    assert result.metrics["val_accuracy"] > 0.8

    name = example.elastic_train.lightning.RayTrainReportCallback.CHECKPOINT_NAME
    with result.checkpoint.as_directory() as d:
        assert sorted(os.listdir(d)) == [".commit.json", name]
        model = example.DigitsClassifier.load_from_checkpoint(os.path.join(d, name))
    assert isinstance(model, example.DigitsClassifier)
