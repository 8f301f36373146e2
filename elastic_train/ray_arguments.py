"""Ray's arguments that mean nothing here, refused with what to do instead.

A Ray script that passes one would otherwise stop at Python's bare
``TypeError: unexpected keyword argument``. Each of our classes that mirrors a
Ray class lists the Ray arguments it does not take: passing Ray's default
(which asks for nothing) is accepted, any other value raises ``ConfigError``
naming the argument and the way out, in the driver, before any process starts.

Example::

    ScalingConfig(num_workers=2, placement_strategy="SPREAD")
    # ConfigError: ScalingConfig(placement_strategy='SPREAD') is a Ray setting with no
    # counterpart here: each node runs its own workers; ...
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from elastic_train.errors import ConfigError

T = TypeVar("T", bound=type)

_NODES = ("each node runs its own workers; to spread a job over several nodes, set "
          "ScalingConfig(num_workers_per_node=...) and start the driver (or `elastic-train "
          "launch`) on every node you want")
_ENVIRONMENT = ("install packages and set environment variables on every node before you "
                "start: the workers inherit the environment of the driver (or of `launch`)")
_CHECKPOINTS = "report a checkpoint from the train function whenever you want one"

# {argument: (Ray's default, what to do instead)}
SCALING_CONFIG = {
    "trainer_resources": (None, "the driver runs in your own process and reserves nothing; "
                                "drop it"),
    "placement_strategy": ("PACK", _NODES),
    "label_selector": (None, _NODES),
    "accelerator_type": (None, "start the job on nodes that have that accelerator; "
                               "use_gpu=True uses their GPUs"),
    "use_tpu": (False, "only CPUs and CUDA GPUs are supported"),
    "topology": (None, "TPUs are not supported, only CPUs and CUDA GPUs"),
    "elastic_resize_monitor_interval_s": (60.0, "returning nodes join at the next rendezvous "
                                                "without polling; drop it"),
}
RUN_CONFIG = {
    "worker_runtime_env": (None, _ENVIRONMENT),
    "runtime_env": (None, _ENVIRONMENT),
    "sync_config": (None, "metrics and checkpoints are written to storage_path directly; "
                          "drop it"),
    "stop": (None, "return from the train function when it is done (Tune's stopping "
                   "criteria do not apply)"),
    "progress_reporter": (None, "the driver prints a status line itself (RunConfig(verbose=0) "
                                "turns it off)"),
    "log_to_file": (False, "every rank's output is kept in the run directory's logs/"),
    "local_dir": (None, "use storage_path"),
}
FAILURE_CONFIG = {
    "fail_fast": (False, "max_failures=0 (the default) already stops at the first failure"),
}
CHECKPOINT_CONFIG = {
    "checkpoint_frequency": (0, _CHECKPOINTS),
    "checkpoint_at_end": (None, _CHECKPOINTS),
}
TORCH_TRAINER = {
    "dataset_config": (None, "datasets are torch Datasets that get_dataset_shard() splits "
                             "across ranks; there is no Ray Data to configure"),
}
VALIDATION_CONFIG = {
    "ray_remote_kwargs": (None, "the validation function runs in a process of its own on "
                                "rank 0's node, with that worker's devices; there is no Ray "
                                "task to size"),
}


def refuse_ray_arguments(table: dict[str, tuple[Any, str]]) -> Callable[[T], T]:
    """Class decorator: the class's ``__init__`` takes the arguments of ``table`` too,
    accepting Ray's default and refusing anything else (see the module docstring)."""

    def decorate(cls: T) -> T:
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            for name in [n for n in kwargs if n in table]:
                value = kwargs.pop(name)
                default, advice = table[name]
                if value != default:
                    raise ConfigError(f"{cls.__name__}({name}={value!r}) is a Ray setting with "
                                      f"no counterpart here: {advice}.")
            init(self, *args, **kwargs)

        cls.__init__ = __init__
        return cls

    return decorate
