"""``prepare_trainer``: checks that a Lightning Trainer is set up for elastic-train."""

from __future__ import annotations

from typing import Any

from elastic_train.errors import ConfigError
from elastic_train.lightning.environment import RayLightningEnvironment
from elastic_train.lightning.strategies import (
    RayDDPStrategy,
    RayDeepSpeedStrategy,
    RayFSDPStrategy,
)

STRATEGIES = (RayDDPStrategy, RayFSDPStrategy, RayDeepSpeedStrategy)


def prepare_trainer(trainer: Any) -> Any:
    """Returns ``trainer`` after checking its strategy and cluster environment (Ray's name).

    The strategy must be one of ours (or a subclass), and the cluster
    environment, if the strategy has one, a ``RayLightningEnvironment``:
    Lightning's own would compute ranks from ``devices`` and start processes.

    Raises:
        ConfigError: naming what is set and what to use instead (Ray raises a
            ``RuntimeError``; ``ConfigError`` is a ``ValueError``, as our other
            input errors are).
    """
    strategy = trainer.strategy
    if not isinstance(strategy, STRATEGIES):
        raise ConfigError(
            f"prepare_trainer(): the Trainer's strategy is {type(strategy).__name__}; use one "
            f"of {', '.join(c.__name__ for c in STRATEGIES)} from elastic_train.lightning, "
            "e.g. pl.Trainer(strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()]).")
    environment = getattr(strategy, "cluster_environment", None)
    if environment is not None and not isinstance(environment, RayLightningEnvironment):
        raise ConfigError(
            f"prepare_trainer(): the Trainer's cluster environment is "
            f"{type(environment).__name__}; pass plugins=[RayLightningEnvironment()] "
            "(from elastic_train.lightning) to pl.Trainer.")
    return trainer
