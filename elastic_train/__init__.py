"""elastic-train: Ray Train's API on torch.distributed.elastic.

A Ray Train script ports by changing imports::

    import elastic_train                       # was: import ray.train
    from elastic_train.torch import TorchTrainer   # was: from ray.train.torch import TorchTrainer
"""

__version__ = "0.1.0"

import importlib
from typing import TYPE_CHECKING, Any

# Public names -> the module that defines them. Imported on first use, so that
# `elastic-train ls` / `show` (storage only) do not pay for `import torch`.
_EXPORTS = {
    "CSVLoggerCallback": "elastic_train.callbacks",
    "RunContext": "elastic_train.callbacks",
    "TensorBoardLoggerCallback": "elastic_train.callbacks",
    "UserCallback": "elastic_train.callbacks",
    "Checkpoint": "elastic_train.checkpoint",
    "CheckpointConfig": "elastic_train.config",
    "FailureConfig": "elastic_train.config",
    "RunConfig": "elastic_train.config",
    "ScalingConfig": "elastic_train.config",
    "TrainContext": "elastic_train.context",
    "ConfigError": "elastic_train.errors",
    "NoProgressError": "elastic_train.errors",
    "PreemptionError": "elastic_train.errors",
    "TrainingFailedError": "elastic_train.errors",
    "WorkerFailure": "elastic_train.errors",
    "PreemptionInfo": "elastic_train.worker.preemption",
    "MetricsConfig": "elastic_train.config",
    "RendezvousConfig": "elastic_train.rendezvous_config",
    "StragglerConfig": "elastic_train.stragglers",
    "Result": "elastic_train.result",
    "ValidationConfig": "elastic_train.validation_config",
    "ValidationFn": "elastic_train.validation_config",
    "ValidationTaskConfig": "elastic_train.validation_config",
    "CheckpointConsistencyMode": "elastic_train.report_config",
    "CheckpointUploadMode": "elastic_train.report_config",
    "ReportedCheckpoint": "elastic_train.report_config",
    "ReportedCheckpointStatus": "elastic_train.report_config",
    "get_all_reported_checkpoints": "elastic_train.worker.session",
    "get_checkpoint": "elastic_train.worker.session",
    "get_context": "elastic_train.worker.session",
    "get_dataset_shard": "elastic_train.worker.session",
    "get_preemption_info": "elastic_train.worker.session",
    "report": "elastic_train.worker.session",
    "should_checkpoint": "elastic_train.worker.session",
    "step": "elastic_train.worker.session",
    "restart_in_process": "elastic_train.worker.inprocess.decorator",
}

__all__ = [*sorted(_EXPORTS), "__version__"]

if TYPE_CHECKING:  # what static tools see
    from elastic_train.callbacks import (
        CSVLoggerCallback,
        RunContext,
        TensorBoardLoggerCallback,
        UserCallback,
    )
    from elastic_train.checkpoint import Checkpoint
    from elastic_train.config import (
        CheckpointConfig,
        FailureConfig,
        MetricsConfig,
        RunConfig,
        ScalingConfig,
    )
    from elastic_train.context import TrainContext
    from elastic_train.errors import (
        ConfigError,
        NoProgressError,
        PreemptionError,
        TrainingFailedError,
        WorkerFailure,
    )
    from elastic_train.rendezvous_config import RendezvousConfig
    from elastic_train.report_config import (
        CheckpointConsistencyMode,
        CheckpointUploadMode,
        ReportedCheckpoint,
        ReportedCheckpointStatus,
    )
    from elastic_train.result import Result
    from elastic_train.stragglers import StragglerConfig
    from elastic_train.validation_config import (
        ValidationConfig,
        ValidationFn,
        ValidationTaskConfig,
    )
    from elastic_train.worker.inprocess.decorator import restart_in_process
    from elastic_train.worker.preemption import PreemptionInfo
    from elastic_train.worker.session import (
        get_all_reported_checkpoints,
        get_checkpoint,
        get_context,
        get_dataset_shard,
        get_preemption_info,
        report,
        should_checkpoint,
        step,
    )


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'elastic_train' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
