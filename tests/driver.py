"""A driver script for tests that signal or kill the driver process itself.

Usage: python -m tests.driver STORAGE NAME PID_DIR [EPOCHS]
Each worker writes its pid into PID_DIR; the final digest is printed.
"""

from __future__ import annotations

import os
import sys

import cloudpickle

import elastic_train as et
from elastic_train.torch import TorchTrainer
from tests import jobs

cloudpickle.register_pickle_by_value(jobs)


def train(config):
    with open(os.path.join(config["pid_dir"], f"worker-{os.getpid()}"), "w") as f:
        f.write(str(os.getpid()))
    return jobs.train_mlp(config)


if __name__ == "__main__":
    storage, name, pid_dir = sys.argv[1:4]
    epochs = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    result = TorchTrainer(
        train,
        train_loop_config={"epochs": epochs, "pid_dir": pid_dir, "step_sleep": 0.05,
                           "starts_file": os.path.join(pid_dir, "starts")},
        scaling_config=et.ScalingConfig(num_workers=2),
        run_config=et.RunConfig(storage_path=storage, name=name),
        datasets={"train": jobs.make_dataset()},
    ).fit()
    print("DIGEST", result.return_value["digest"], flush=True)
