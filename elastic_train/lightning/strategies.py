"""Lightning strategies for workers that elastic-train started (mirrors Ray's).

The process group already exists when the train function runs (Lightning sees
it and does not create another), so these strategies only tell Lightning the
worker's device and how to split the data: one shard per rank of the job.
They take the same arguments as Lightning's ``DDPStrategy``, ``FSDPStrategy``
and ``DeepSpeedStrategy``; the process group's backend and timeout are
``TorchConfig``'s, as in Ray.
"""

from __future__ import annotations

import importlib.util
from types import ModuleType
from typing import Any

import torch

from elastic_train.lightning.flavour import LightningBound
from elastic_train.torch.train_loop_utils import get_device


class _RayStrategy(LightningBound):
    """What every strategy here overrides of its Lightning base."""

    @property
    def root_device(self) -> torch.device:
        return get_device()

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": self.world_size, "rank": self.global_rank}


class RayDDPStrategy(_RayStrategy):
    """Lightning's ``DDPStrategy`` on elastic-train's workers (Ray's name).

    Example::

        trainer = pl.Trainer(strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()],
                             callbacks=[RayTrainReportCallback()], devices="auto",
                             accelerator="auto")
    """

    @staticmethod
    def _lightning_base(pl: ModuleType) -> type:
        return pl.strategies.DDPStrategy


class RayFSDPStrategy(_RayStrategy):
    """Lightning's ``FSDPStrategy`` on elastic-train's workers (Ray's name).

    Needs Lightning >= 2.1, whose FSDP strategy gathers or shards the state dict
    itself (``state_dict_type=``); Ray patches 2.0's.
    """

    @staticmethod
    def _lightning_base(pl: ModuleType) -> type:
        return pl.strategies.FSDPStrategy


class RayDeepSpeedStrategy(_RayStrategy):
    """Lightning's ``DeepSpeedStrategy`` on elastic-train's workers (Ray's name).

    Needs the ``deepspeed`` package, which no extra of elastic-train installs.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if importlib.util.find_spec("deepspeed") is None:
            raise ImportError(
                "RayDeepSpeedStrategy needs DeepSpeed, which is not installed: pip install "
                "deepspeed (no extra of elastic-train installs it), or use RayDDPStrategy or "
                "RayFSDPStrategy.")
        super().__init__(*args, **kwargs)

    @staticmethod
    def _lightning_base(pl: ModuleType) -> type:
        return pl.strategies.DeepSpeedStrategy
