"""The seam between the framework-neutral worker and a training framework.

A :class:`BackendConfig` sets up a worker process for its framework (process
group, device, threads) and tears it down; ``TorchConfig`` is the one we ship.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from elastic_train.config import ScalingConfig
from elastic_train.context import WorkerEnv


@dataclass(frozen=True)
class WorkerResources:
    """What a backend gave the worker: its devices and the group for control messages.

    ``control_group`` is a CPU (gloo) process group the session uses to agree
    on checkpoints, whatever backend the training itself uses.
    """

    devices: list[torch.device]
    control_group: Any


class BackendConfig:
    """Base class of framework set-ups (mirrors Ray Train's ``BackendConfig``)."""

    def validate(self, scaling: ScalingConfig) -> None:
        """Raises ``ConfigError`` in the driver when the settings cannot work here."""

    def on_worker_start(self, env: WorkerEnv, scaling: ScalingConfig) -> WorkerResources:
        raise NotImplementedError

    def on_worker_shutdown(self) -> None:
        """Releases what ``on_worker_start`` set up."""
