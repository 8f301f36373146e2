"""A driver script for tests that signal or kill the driver process itself.

Usage:
    python -m tests.e2e.scripts.driver STORAGE NAME PID_DIR
        [EPOCHS [STEP_SLEEP [PREEMPTION_GRACE_S]]]

Each worker writes its pid into PID_DIR; the final digest is printed. With a
grace period, the job also saves a just-in-time checkpoint on a preemption notice.
"""

from __future__ import annotations

import os
import sys

import cloudpickle

import elastic_train as et
from elastic_train.torch import TorchTrainer
from tests.support import jobs

cloudpickle.register_pickle_by_value(jobs)

def train(config):
    with open(os.path.join(config["pid_dir"], f"worker-{os.getpid()}"), "w") as f:
        f.write(str(os.getpid()))
    return jobs.train_mlp(config)


if __name__ == "__main__":
    storage, name, pid_dir = sys.argv[1:4]
    epochs = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    step_sleep = float(sys.argv[5]) if len(sys.argv) > 5 else 0.05
    grace = float(sys.argv[6]) if len(sys.argv) > 6 else None
    result = TorchTrainer(
        train,
        train_loop_config={"epochs": epochs, "pid_dir": pid_dir, "step_sleep": step_sleep,
                           "starts_file": os.path.join(pid_dir, "starts"),
                           "watch_preemption": grace is not None,
                           "jit_file": os.path.join(pid_dir, "jit"),
                           "events_file": os.path.join(pid_dir, "events")},
        scaling_config=et.ScalingConfig(num_workers=2),
        run_config=et.RunConfig(
            storage_path=storage, name=name,
            failure_config=et.FailureConfig(preemption_grace_s=grace or 25.0)),
        datasets={"train": jobs.make_dataset()},
    ).fit()
    print("DIGEST", result.return_value["digest"], flush=True)
