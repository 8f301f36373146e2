"""elastic-train: Ray Train's API on torch.distributed.elastic.

A Ray Train script ports by changing imports::

    import elastic_train                       # was: import ray.train
    from elastic_train.torch import TorchTrainer   # was: from ray.train.torch import TorchTrainer
"""

__version__ = "0.1.0"

from elastic_train.callbacks import (
    CSVLoggerCallback,
    RunContext,
    TensorBoardLoggerCallback,
    UserCallback,
)
from elastic_train.checkpoint import Checkpoint
from elastic_train.config import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from elastic_train.context import TrainContext
from elastic_train.errors import (
    ConfigError,
    PreemptionError,
    TrainingFailedError,
    WorkerFailure,
)
from elastic_train.preemption import PreemptionInfo
from elastic_train.rendezvous_config import RendezvousConfig
from elastic_train.result import Result
from elastic_train.session import (
    CheckpointUploadMode,
    get_checkpoint,
    get_context,
    get_dataset_shard,
    get_preemption_info,
    report,
)

__all__ = [
    "CSVLoggerCallback",
    "RunContext",
    "TensorBoardLoggerCallback",
    "UserCallback",
    "Checkpoint",
    "CheckpointConfig",
    "CheckpointUploadMode",
    "ConfigError",
    "FailureConfig",
    "PreemptionError",
    "PreemptionInfo",
    "RendezvousConfig",
    "Result",
    "RunConfig",
    "ScalingConfig",
    "TrainContext",
    "TrainingFailedError",
    "WorkerFailure",
    "__version__",
    "get_checkpoint",
    "get_context",
    "get_dataset_shard",
    "get_preemption_info",
    "report",
]
