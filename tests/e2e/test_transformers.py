"""Ray's Hugging Face Transformers guide with the imports changed
(examples/transformers_tiny.py: a tiny BERT from a config, nothing downloaded) on 2
workers: a worker SIGKILLed after the first saved checkpoint, then
trainer.train(resume_from_checkpoint=...) from get_checkpoint() finishes the run."""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import pytest

import elastic_train as et
from elastic_train.torch import TorchTrainer
from tests.support.examples import kill_self_once_committed, load_example

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytest.importorskip("sklearn")

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420),
              pytest.mark.usefixtures("no_leaked_processes")]

EPOCHS = 3


def kill_rank1_after_first_save(marker: str):
    from transformers import TrainerCallback

    class KillAfterSave(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if args.process_index == 1:
                kill_self_once_committed(marker, "checkpoint_000000")

    return KillAfterSave()


def stale_checkpoint(output_dir: str) -> None:
    """A finished run's checkpoint left in the Trainer's output_dir: reporting it (the
    highest-numbered directory there) instead of the one just saved would resume a
    run that has nothing left to train."""
    os.makedirs(os.path.join(output_dir, "checkpoint-999"))
    with open(os.path.join(output_dir, "checkpoint-999", "trainer_state.json"), "w") as f:
        json.dump({"global_step": 999, "epoch": 99.0}, f)


def test_transformers_guide_resumes_from_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    example = load_example("transformers_tiny")
    name = f"transformers-{os.getpid()}"
    output_dir = os.path.join(tempfile.gettempdir(), "elastic_train_hf", name)  # the example's
    stale_checkpoint(output_dir)
    try:
        run_and_check(example, name, tmp_path)
    finally:
        shutil.rmtree(output_dir, ignore_errors=True)


def run_and_check(example, name, tmp_path):
    result = TorchTrainer(
        example.train_func,
        train_loop_config={"epochs": EPOCHS, "lr": 1e-3,
                           "callbacks": [kill_rank1_after_first_save(str(tmp_path / "m"))]},
        scaling_config=et.ScalingConfig(num_workers=2),
        run_config=et.RunConfig(storage_path=str(tmp_path / "results"), name=name,
                                failure_config=et.FailureConfig(max_failures=1)),
    ).fit()

    with open(os.path.join(result.path, "run.json")) as f:
        [failure] = json.load(f)["failures"]
    assert failure["workers"][0]["rank"] == 1 and failure["workers"][0]["signal"] == "SIGKILL"
    rows = result.metrics_dataframe
    assert rows["training_iteration"].tolist() == list(range(1, EPOCHS + 1))
    assert rows["epoch"].tolist() == [float(e) for e in range(1, EPOCHS + 1)]
    assert rows["iterations_since_restore"].tolist() == [1, 1, 2]  # resumed after epoch 1
    assert rows["eval_loss"].iloc[-1] < rows["eval_loss"].iloc[0]  # it learns

    name = example.elastic_train.huggingface.transformers.RayTrainReportCallback.CHECKPOINT_NAME
    with result.checkpoint.as_directory() as d:
        with open(os.path.join(d, name, "trainer_state.json")) as f:
            state = json.load(f)
        files = os.listdir(os.path.join(d, name))
    assert state["epoch"] == EPOCHS and state["global_step"] == EPOCHS * (1437 // 2 // 16 + 1)
    assert {"model.safetensors", "optimizer.pt", "rng_state_0.pth", "rng_state_1.pth"} \
        <= set(files)
