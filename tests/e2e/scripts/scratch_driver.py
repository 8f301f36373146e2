"""A driver whose scratch directories a test looks at: ``python -m tests.e2e.scripts.scratch_driver
STORAGE NAME READY_FILE SECONDS``. Its single worker writes READY_FILE, then trains for
SECONDS (a test SIGKILLs this driver meanwhile, or lets it finish)."""

from __future__ import annotations

import sys
import time

import elastic_train as et
from elastic_train.torch import TorchTrainer


def train(config):
    with open(config["ready"], "w") as f:
        f.write("running")
    time.sleep(config["seconds"])


if __name__ == "__main__":
    storage, name, ready, seconds = sys.argv[1:5]
    TorchTrainer(train, train_loop_config={"ready": ready, "seconds": float(seconds)},
                 scaling_config=et.ScalingConfig(num_workers=1),
                 run_config=et.RunConfig(storage_path=storage, name=name)).fit()
    print("FINISHED", flush=True)
