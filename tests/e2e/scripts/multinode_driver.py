"""One node's driver of a multi-node ``fit()``: the same script runs on every node.

Usage:
    python -m tests.e2e.scripts.multinode_driver STORAGE NAME OUT_DIR BACKEND ENDPOINT
        MIN MAX EPOCHS

Each node runs one worker; the job has MIN to MAX nodes. At every (re)start rank 0
appends the world size to OUT_DIR/worlds and the start epoch to OUT_DIR/starts, and
every rank its rank and pid to OUT_DIR/pids; at the end the driver prints a RESULT
line (last iteration, checkpoint, return value).
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
    ctx = et.get_context()
    if ctx.get_world_rank() == 0:  # train_mlp then appends the start epoch to "starts"
        with open(config["worlds_file"], "a") as f:
            f.write(f"{ctx.get_world_size()}\n")
    return jobs.train_mlp(config)


if __name__ == "__main__":
    storage, name, out_dir, backend, endpoint, low, high, epochs = sys.argv[1:9]
    scaling = et.ScalingConfig(
        num_workers=(int(low), int(high)), num_workers_per_node=1,
        rendezvous=et.RendezvousConfig(backend=backend, endpoint=endpoint, run_id=name))
    result = TorchTrainer(
        train,
        train_loop_config={"epochs": int(epochs), "step_sleep": 0.05,
                           "starts_file": os.path.join(out_dir, "starts"),
                           "worlds_file": os.path.join(out_dir, "worlds"),
                           "pids_file": os.path.join(out_dir, "pids")},
        scaling_config=scaling,
        run_config=et.RunConfig(storage_path=storage, name=name,
                                failure_config=et.FailureConfig(max_failures=1)),
        datasets={"train": jobs.make_dataset()},
    ).fit()
    value = result.return_value or {}
    print(f"RESULT pid={os.getpid()} iteration={result.metrics['training_iteration']} "
          f"checkpoint={os.path.basename(result.checkpoint.path)} "
          f"world={value.get('world_size')}", flush=True)
