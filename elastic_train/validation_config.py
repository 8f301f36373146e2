"""Ray 2.60's asynchronous validation settings, under Ray's names and defaults.

``TorchTrainer(validation_config=ValidationConfig(fn, task_config=...))`` names the
function; ``report(..., checkpoint=..., validation=True | ValidationTaskConfig(...))``
asks for it to run on that checkpoint once committed, off the training path (see
:mod:`elastic_train.worker.validation_runner`). What ``fn`` returns is merged into the
checkpoint's metrics row (keys of the same name overwritten, as Ray merges them), so
a validation metric can be ``CheckpointConfig.checkpoint_score_attribute``. No torch
import: the driver checks these before any process starts.

Example::

    def validate(checkpoint, batch_size):
        with checkpoint.as_directory() as d:
            model = load(d)
        return {"val_accuracy": evaluate(model, batch_size)}

    trainer = TorchTrainer(train_func, validation_config=ValidationConfig(
        validate, task_config=ValidationTaskConfig(fn_kwargs={"batch_size": 64})))
    # in train_func:
    elastic_train.report(metrics, checkpoint=checkpoint, validation=True)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from elastic_train._internal.ray_arguments import (
    RAY_REMOTE_KWARGS,
    env_vars_of,
    notes_of,
    sort_keys,
)
from elastic_train.errors import ConfigError

if TYPE_CHECKING:
    from elastic_train.checkpoint import Checkpoint
    from elastic_train.config import ScalingConfig


class ValidationFn(Protocol):
    """A function that validates a checkpoint: ``fn(checkpoint, **fn_kwargs) -> dict``."""

    def __call__(self, checkpoint: Checkpoint, **kwargs: Any) -> dict:
        ...


@dataclass
class ValidationTaskConfig:
    """One validation's settings, passed to ``report(validation=...)`` (or the defaults,
    as ``ValidationConfig(task_config=...)``).

    Args:
        fn_kwargs: JSON-serialisable keyword arguments of the validation function
            (the checkpoint is always its first argument). A report's override the
            ``ValidationConfig``'s defaults of the same name.
        timeout_s: Seconds the validation may run; then its process is killed and
            the checkpoint's status is ``VALIDATION_TIMEOUT``. None: no limit.
            As in Ray, a report's ``ValidationTaskConfig`` brings its own
            ``timeout_s`` (None included); ``validation=True`` uses the default's.
    """

    fn_kwargs: dict[str, Any] | None = None
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.fn_kwargs is None:
            self.fn_kwargs = {}
        if not isinstance(self.fn_kwargs, dict) or not all(
                isinstance(k, str) for k in self.fn_kwargs):
            raise ConfigError(f"ValidationTaskConfig(fn_kwargs={self.fn_kwargs!r}) must be a "
                              "dict of keyword arguments, e.g. {'batch_size': 64}.",
                              field="ValidationTaskConfig.fn_kwargs")
        try:  # stored with the checkpoint, so that a restart can run it again
            json.dumps(self.fn_kwargs)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"ValidationTaskConfig(fn_kwargs={self.fn_kwargs!r}) must be "
                              f"JSON-serialisable ({exc}): pass paths and numbers, and load "
                              "data inside the validation function.",
                              field="ValidationTaskConfig.fn_kwargs") from None
        if self.timeout_s is not None and (
                isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float))
                or self.timeout_s <= 0):
            raise ConfigError(f"ValidationTaskConfig(timeout_s={self.timeout_s!r}): pass a "
                              "number of seconds > 0, or None for no timeout.",
                              field="ValidationTaskConfig.timeout_s")


class ValidationConfig:
    """The trainer's validation function and its default task settings (Ray's class).

    Args:
        fn: Called as ``fn(checkpoint, **fn_kwargs)`` on each checkpoint reported
            with ``validation=``; returns a dict of metrics.
        task_config: The defaults (``fn_kwargs``, ``timeout_s``); a report's
            ``ValidationTaskConfig`` overrides its ``fn_kwargs`` key by key.
        ray_remote_kwargs: Ray's options of the validation task. The function runs
            in a process of its own on rank 0's node, so ``num_gpus=n`` gives it the
            first ``n`` of rank 0's GPUs (only those are visible to it; without
            ``num_gpus`` it sees what rank 0's worker sees), ``runtime_env``'s
            ``env_vars`` are set in it, and the options that only size or place
            Ray's task (``num_cpus``, ``memory``, ``resources``...) are ignored with
            one warning at ``fit()`` (see
            :data:`elastic_train._internal.ray_arguments.RAY_REMOTE_KWARGS`).
    """

    def __init__(self, fn: ValidationFn,
                 task_config: ValidationTaskConfig | None = None,
                 ray_remote_kwargs: dict[str, Any] | None = None):
        if not callable(fn):
            raise ConfigError(f"ValidationConfig(fn={fn!r}) is not callable: pass a function "
                              "def validate(checkpoint, **kwargs) -> dict.",
                              field="ValidationConfig.fn")
        if task_config is not None and not isinstance(task_config, ValidationTaskConfig):
            raise ConfigError(f"ValidationConfig(task_config={task_config!r}) must be a "
                              "ValidationTaskConfig.", field="ValidationConfig.task_config")
        if ray_remote_kwargs is not None and not isinstance(ray_remote_kwargs, dict):
            raise ConfigError(f"ValidationConfig(ray_remote_kwargs={ray_remote_kwargs!r}) must "
                              "be a dict of Ray task options, e.g. {'num_gpus': 1}.",
                              field="ValidationConfig.ray_remote_kwargs")
        self.fn = fn
        self.task_config = task_config if task_config is not None else ValidationTaskConfig()
        honoured = sort_keys(notes_of(self), "ValidationConfig(ray_remote_kwargs",
                             ray_remote_kwargs or {}, RAY_REMOTE_KWARGS)
        self.num_gpus = honoured.get("num_gpus", 0)
        if not (isinstance(self.num_gpus, (int, float)) and not isinstance(self.num_gpus, bool)
                and self.num_gpus >= 0):
            raise ConfigError(f"ValidationConfig(ray_remote_kwargs={{'num_gpus': "
                              f"{self.num_gpus!r}}}) must be a number of GPUs >= 0.",
                              field="ValidationConfig.ray_remote_kwargs")
        self.env_vars = env_vars_of(notes_of(self),
                                    "ValidationConfig(ray_remote_kwargs['runtime_env']",
                                    honoured.get("runtime_env"))

    def check_devices(self, scaling: ScalingConfig) -> None:
        """``num_gpus`` must fit in rank 0's devices, which the validation process gets:
        checked in the driver, before any process starts."""
        if not self.num_gpus:
            return
        have = max(1, int(scaling.gpus_per_worker)) if scaling.use_gpu else 0
        if math.ceil(self.num_gpus) > have:
            raise ConfigError(
                f"ValidationConfig(ray_remote_kwargs={{'num_gpus': {self.num_gpus!r}}}) cannot "
                f"be given: the validation process gets rank 0's GPUs and rank 0 has {have} "
                f"(ScalingConfig(use_gpu={scaling.use_gpu}, resources_per_worker="
                f"{scaling.resources_per_worker!r})). Give each worker as many, e.g. "
                f"ScalingConfig(use_gpu=True, resources_per_worker={{'GPU': "
                f"{math.ceil(self.num_gpus)}}}), or ask for fewer.",
                field="ValidationConfig.ray_remote_kwargs")

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", repr(self.fn))
        return f"ValidationConfig(fn={name}, task_config={self.task_config!r})"

    def task(self, validation: bool | ValidationTaskConfig) -> dict[str, Any]:
        """What one report's ``validation`` asks for, resolved as Ray resolves it:
        ``{"fn_kwargs": defaults merged with the report's, "timeout_s": ...}``."""
        if validation is True:
            return {"fn_kwargs": dict(self.task_config.fn_kwargs or {}),
                    "timeout_s": self.task_config.timeout_s}
        assert isinstance(validation, ValidationTaskConfig)
        return {"fn_kwargs": {**(self.task_config.fn_kwargs or {}),
                              **(validation.fn_kwargs or {})},
                "timeout_s": validation.timeout_s}


def check_validation(validation: Any) -> bool | ValidationTaskConfig:
    """``report(validation=...)`` checked: False, True or a ValidationTaskConfig."""
    if validation is False or validation is None:
        return False
    if validation is True or isinstance(validation, ValidationTaskConfig):
        return validation
    raise ConfigError(f"report(validation={validation!r}): pass True (the trainer's "
                      "ValidationConfig defaults), a ValidationTaskConfig(...), or False.")
