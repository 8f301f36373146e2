"""``TorchTrainer``: data-parallel PyTorch training, mirroring ``ray.train.torch.TorchTrainer``.

Example::

    from elastic_train import ScalingConfig, RunConfig
    from elastic_train.torch import TorchTrainer

    def train_func(config):
        ...  # build the model, prepare_model(model), train, report(...)

    result = TorchTrainer(train_func, train_loop_config={"lr": 1e-3},
                          scaling_config=ScalingConfig(num_workers=2),
                          run_config=RunConfig(name="demo")).fit()
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from elastic_train._internal.ray_arguments import TORCH_TRAINER, takes_ray_arguments
from elastic_train.checkpoint import Checkpoint
from elastic_train.config import RunConfig, ScalingConfig
from elastic_train.driver.trainer import DataParallelTrainer, _trainer_arguments
from elastic_train.errors import ConfigError
from elastic_train.torch.config import TorchConfig
from elastic_train.validation_config import ValidationConfig
from elastic_train.worker.run_spec import RunSpec


@takes_ray_arguments(TORCH_TRAINER)
class TorchTrainer(DataParallelTrainer):
    """Runs ``train_loop_per_worker`` on N processes with a torch process group.

    Args:
        train_loop_per_worker: The train function; takes no argument or the
            ``train_loop_config`` dict.
        train_loop_config: Passed to the train function.
        torch_config: Process-group settings (default ``TorchConfig()``).
        scaling_config: Workers and their resources.
        run_config: Name, storage, failure and checkpoint settings.
        datasets: ``{"train": torch Dataset}``, read per rank with
            ``get_dataset_shard("train")``.
        resume_from_checkpoint: The checkpoint ``get_checkpoint()`` returns on
            a fresh run.
        metadata: JSON-serialisable dict, available as
            ``get_context().get_metadata()``.
        validation_config: The function ``report(..., validation=...)`` validates
            checkpoints with, asynchronously (Ray's, see
            :class:`elastic_train.ValidationConfig`).
    """

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: dict[str, Any] | None = None,
        torch_config: TorchConfig | None = None,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        datasets: dict[str, Any] | None = None,
        resume_from_checkpoint: Checkpoint | None = None,
        metadata: dict[str, Any] | None = None,
        validation_config: ValidationConfig | None = None,
    ):
        if torch_config is not None and not isinstance(torch_config, TorchConfig):
            raise ConfigError(f"torch_config={torch_config!r} must be a TorchConfig.")
        super().__init__(
            train_loop_per_worker,
            backend_config=torch_config or TorchConfig(),
            train_loop_config=train_loop_config,
            scaling_config=scaling_config,
            run_config=run_config,
            datasets=datasets,
            resume_from_checkpoint=resume_from_checkpoint,
            metadata=metadata,
            validation_config=validation_config,
        )

    @classmethod
    def _from_spec(cls, spec: RunSpec) -> TorchTrainer:
        return cls(spec.train_loop_per_worker, torch_config=spec.backend,
                   **_trainer_arguments(spec))
