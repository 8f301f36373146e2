"""A user's script that asks for CUDA before fit(), as most do
(``device = "cuda" if torch.cuda.is_available() else "cpu"``); one worker is SIGKILLed
once. Usage: python -m tests.e2e.scripts.fork_poison_driver STORAGE OUT"""

import sys

import torch

from elastic_train import FailureConfig, RunConfig, ScalingConfig
from elastic_train.torch import TorchTrainer
from tests.support import fork_poison

if __name__ == "__main__":
    storage, out = sys.argv[1:3]
    print("cuda available:", torch.cuda.is_available())
    TorchTrainer(fork_poison.train,
                 train_loop_config={"out": out, "kill_rank": 1, "kill_after_s": 3},
                 scaling_config=ScalingConfig(num_workers=2),
                 run_config=RunConfig(storage_path=storage, name="fork-poison",
                                      failure_config=FailureConfig(max_failures=1))).fit()
