"""``RunSpec``: everything a worker needs to run the user's training, pickled by the driver."""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from elastic_train.checkpoint import Checkpoint
from elastic_train.config import RunConfig, ScalingConfig
from elastic_train.errors import ConfigError
from elastic_train.validation_config import ValidationConfig
from elastic_train.worker.backend import BackendConfig


def check_train_function(fn: Callable[..., Any]) -> None:
    """The train function takes no argument or one (the config dict), as in Ray."""
    if not callable(fn):
        raise ConfigError(
            f"train_loop_per_worker={fn!r} is not callable: pass a function such as "
            "def train_func(config): ..."
        )
    params = [
        p for p in inspect.signature(fn).parameters.values()
        if p.default is inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    if len(params) > 1 or any(p.kind is p.KEYWORD_ONLY for p in params):
        raise ConfigError(
            f"train_loop_per_worker {getattr(fn, '__name__', fn)!r} takes "
            f"{len(params)} required arguments ({', '.join(p.name for p in params)}): it must "
            "take none or one (the train_loop_config dict)."
        )


def takes_config(fn: Callable[..., Any]) -> bool:
    return len(inspect.signature(fn).parameters) >= 1


@dataclass
class RunSpec:
    """The driver's description of a run, read by every worker.

    ``train_loop_per_worker`` is None for scripts run by ``elastic-train launch``,
    which run themselves.
    """

    train_loop_per_worker: Callable[..., Any] | None
    train_loop_config: dict[str, Any] | None
    backend: BackendConfig
    scaling_config: ScalingConfig
    run_config: RunConfig
    experiment_name: str
    datasets: dict[str, Any] = field(default_factory=dict)
    resume_from_checkpoint: Checkpoint | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    validation_config: ValidationConfig | None = None

    def call_train_function(self) -> Any:
        """Calls the train function with a copy of ``train_loop_config``: an attempt after
        an in-process restart gets the config as given, whatever the last one did to it."""
        fn = self.train_loop_per_worker
        if takes_config(fn):
            return fn(copy.deepcopy(self.train_loop_config)
                      if self.train_loop_config is not None else {})
        return fn()
