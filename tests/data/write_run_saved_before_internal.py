"""Writes tests/data/run_saved_before_internal/: a run stopped by a failure after two
checkpoints, whose trainable.pkl names the modules where they lived before they moved
under elastic_train/_internal/ (e.g. ``elastic_train.pickling._named_code``).

Kept to show how the saved run was made; run with the code of that time (see the
README beside it), not with today's, which would write today's module paths::

    PYTHONPATH=$PWD python tests/data/write_run_saved_before_internal.py
"""

from __future__ import annotations

import os
import shutil
import tempfile

import elastic_train as et
from elastic_train.torch import TorchTrainer

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = "run_saved_before_internal"


def train(config: dict) -> None:
    """Three steps, a checkpoint each; the first launch fails after the second."""
    start = 0
    checkpoint = et.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d, open(os.path.join(d, "step")) as f:
            start = int(f.read())
    for step in range(start + 1, config["steps"] + 1):
        staging = tempfile.mkdtemp()
        with open(os.path.join(staging, "step"), "w") as f:
            f.write(str(step))
        et.report({"step": step, "restored_from": start},
                  checkpoint=et.Checkpoint.from_directory(staging))
        if step == 2 and start == 0:
            raise RuntimeError("stopped on purpose after the second checkpoint")


def main() -> None:
    shutil.rmtree(os.path.join(HERE, NAME), ignore_errors=True)
    trainer = TorchTrainer(
        train, train_loop_config={"steps": 3},
        scaling_config=et.ScalingConfig(num_workers=1, use_gpu=False),
        run_config=et.RunConfig(storage_path=HERE, name=NAME,
                                failure_config=et.FailureConfig(max_failures=0)))
    try:
        trainer.fit()
    except et.TrainingFailedError:
        return
    raise SystemExit("the run was meant to fail after its second checkpoint")


if __name__ == "__main__":
    main()
