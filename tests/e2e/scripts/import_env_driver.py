"""fit() of a train function whose module the driver imported, and which reads the
worker's environment at import. Usage: python -m tests.e2e.scripts.import_env_driver STORAGE OUT"""

import sys

from elastic_train import RunConfig, ScalingConfig
from elastic_train.torch import TorchTrainer
from tests.support import import_env

if __name__ == "__main__":
    storage, out = sys.argv[1:3]
    TorchTrainer(import_env.train, train_loop_config={"out": out},
                 scaling_config=ScalingConfig(num_workers=2),
                 run_config=RunConfig(storage_path=storage, name="import-env")).fit()
