"""Ray's arguments that our classes take under Ray's names, sorted into three kinds.

A Ray Train script ports by changing its imports, so each of our classes that mirrors
a Ray class takes Ray's arguments too, and this module says what each one does here:

- **honoured**: we have its meaning and do it (``FailureConfig(fail_fast=True)`` is
  ``max_failures=0``);
- **ignored**: it only sizes or places Ray's tasks and actors and cannot change what is
  trained (``ScalingConfig(placement_strategy="SPREAD")``); accepted, and the driver
  logs one warning per argument per run, at ``fit()``, naming it and what happens
  instead;
- **refused**: ignoring it would change the result or lose data
  (``RunConfig(stop=...)``, ``runtime_env={"pip": [...]}``): a ``ConfigError`` naming
  it and the way out, raised where the object is built, before any process starts.

Passing Ray's default of any argument (which asks for nothing) is accepted silently.
``ELASTIC_TRAIN_RAY_STRICT=1`` makes every ignored argument a ``ConfigError`` too, for
users who want a strict port (:class:`elastic_train._internal.env_vars.Switches`). The tables
below are the whole list; ``docs/porting-from-ray.md`` shows them (a unit test keeps
the two equal).

Example::

    ScalingConfig(num_workers=2, placement_strategy="SPREAD")
    # fit() logs once: ScalingConfig(placement_strategy='SPREAD') is ignored: each node
    # runs its own workers (...). (ELASTIC_TRAIN_RAY_STRICT=1 makes this an error.)
"""

from __future__ import annotations

import enum
import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from elastic_train._internal import env_vars
from elastic_train.errors import ConfigError

logger = logging.getLogger(__name__)

T = TypeVar("T", bound=type)

_NOTES = "_ray_ignored"  # {label: warning}, on the object that took ignored arguments


class Kind(enum.Enum):
    HONOURED = "honoured"
    IGNORED = "ignored"
    REFUSED = "refused"


Apply = Callable[[dict[str, Any], Any, dict[str, str]], None]


@dataclass(frozen=True)
class RayArgument:
    """One Ray argument: its kind and what it does here (honoured), what happens instead
    (ignored) or the way out (refused). ``default`` is Ray's, accepted silently;
    ``apply(kwargs, value, notes)`` rewrites an honoured argument into our own arguments
    (and may note it ignored after all, see :func:`note_ignored`)."""

    kind: Kind
    says: str
    default: Any = None
    apply: Apply | None = None


def honoured(says: str, apply: Apply | None = None,
             default: Any = None) -> RayArgument:
    return RayArgument(Kind.HONOURED, says, default, apply)


def ignored(says: str, default: Any = None) -> RayArgument:
    return RayArgument(Kind.IGNORED, says, default)


def refused(says: str, default: Any = None) -> RayArgument:
    return RayArgument(Kind.REFUSED, says, default)


OTHER = "*"  # in a table of a dict argument's keys: any key the table does not name
_ENVIRONMENT = ("install packages and copy code onto every node before you start: the "
                "workers run the Python environment and files of the driver (or of `launch`)")
_PLACEMENT = ("each node runs its own workers (to spread a job over nodes, set "
              "ScalingConfig(num_workers_per_node=...) and start the driver, or `elastic-train "
              "launch`, on every node you want)")
_TPU = "TPUs are not supported, only CPUs and CUDA GPUs: use use_gpu=True or CPUs"
_CHECKPOINTS = ("report a checkpoint from the train function whenever you want one (Ray's "
                "TorchTrainer never checkpoints by itself either)")
_VALIDATION_PLACE = ("the validation runs in a process of its own on rank 0's node, with "
                     "what that node has")


def _fail_fast(kwargs: dict[str, Any], value: Any, _notes: dict[str, str]) -> None:
    if value not in (True, "raise"):
        raise ConfigError(f"FailureConfig(fail_fast={value!r}) is invalid: use True or "
                          "'raise' (stop at the first failure), or False.",
                          field="FailureConfig.fail_fast")
    if kwargs.get("max_failures", 0) != 0:
        raise ConfigError(f"FailureConfig(fail_fast={value!r}, "
                          f"max_failures={kwargs['max_failures']!r}): fail_fast stops at the "
                          "first failure, so max_failures must be 0 (as in Ray): drop one.",
                          field="FailureConfig.fail_fast")
    kwargs["max_failures"] = 0


def _local_dir(kwargs: dict[str, Any], value: Any, notes: dict[str, str]) -> None:
    if kwargs.get("storage_path") is None:
        kwargs["storage_path"] = value
    else:  # Ray's local copy of a run whose storage is storage_path: we stage elsewhere
        note_ignored(notes, f"RunConfig(local_dir={value!r})",
                     "with storage_path given, it was Ray's local cache of the run; workers "
                     "stage checkpoints in the node's scratch directory instead",
                     "RunConfig.local_dir")


def _runtime_env(kwargs: dict[str, Any], value: Any, _notes: dict[str, str]) -> None:
    if kwargs.get("worker_runtime_env") is not None:
        raise ConfigError("RunConfig(runtime_env=..., worker_runtime_env=...): pass one of "
                          "them (worker_runtime_env is Ray's newer name).",
                          field="RunConfig.runtime_env")
    kwargs["worker_runtime_env"] = value


# {argument: what it does here}, per class.
SCALING_CONFIG = {
    "trainer_resources": ignored("the driver runs in your own process and reserves nothing"),
    "placement_strategy": ignored(_PLACEMENT, default="PACK"),
    "label_selector": ignored(_PLACEMENT),
    "accelerator_type": ignored("the job uses the GPUs of the nodes you start it on, "
                                "whatever their type (use_gpu=True)"),
    "elastic_resize_monitor_interval_s": ignored(
        "nodes that come back join at the next rendezvous, without polling", default=60.0),
    "use_tpu": refused(_TPU, default=False),
    "topology": refused(_TPU),
}
# Keys of ScalingConfig.resources_per_worker beyond "CPU" and "GPU", which are ours.
RESOURCES_PER_WORKER = {
    "memory": ignored("memory is not reserved; each worker uses what it needs"),
    "TPU": refused(_TPU),
    OTHER: ignored("a custom Ray resource only places workers; each node runs its own"),
}

RUN_CONFIG = {
    "runtime_env": honoured("Ray's older name of worker_runtime_env", _runtime_env),
    "local_dir": honoured("storage_path, when storage_path is not given (Ray's results "
                          "directory before storage_path existed); else ignored", _local_dir),
    "sync_config": ignored("metrics and checkpoints are written to storage_path directly"),
    "progress_reporter": ignored("the driver prints a status line itself "
                                 "(RunConfig(verbose=0) turns it off)"),
    "log_to_file": ignored("every rank's output is kept in the run directory's logs/ already",
                           default=False),
    "stop": refused("return from the train function when it is done (Tune's stopping "
                    "criteria do not apply)"),
}
# Keys of RunConfig.worker_runtime_env (and of ray_remote_kwargs' runtime_env): pip,
# conda, uv, working_dir, py_modules, image_uri... would run other code than expected.
RUNTIME_ENV = {
    "env_vars": honoured("set in every worker (and validation process) before the train "
                         "function starts"),
    "config": ignored("there is no runtime environment to set up"),
    "excludes": ignored("no working_dir is uploaded, so there is nothing to exclude"),
    OTHER: refused(_ENVIRONMENT),
}

FAILURE_CONFIG = {
    "fail_fast": honoured("max_failures=0: the run stops at the first failure", _fail_fast,
                          default=False),
    "controller_failure_limit": ignored(
        "the driver is not restarted; a run whose driver died continues with "
        "TorchTrainer.restore(path)", default=-1),
}
CHECKPOINT_CONFIG = {
    "checkpoint_frequency": refused(_CHECKPOINTS, default=0),
    "checkpoint_at_end": refused(_CHECKPOINTS),
}
TORCH_TRAINER = {
    "dataset_config": refused("datasets are torch Datasets that get_dataset_shard() splits "
                              "across ranks; there is no Ray Data to configure"),
}
# Keys of ValidationConfig(ray_remote_kwargs=...): Ray's options of the validation task.
RAY_REMOTE_KWARGS = {
    "num_gpus": honoured("the validation process sees rank 0's GPU(s) only (as many as "
                         "asked, from rank 0's devices); refused when rank 0 has fewer",
                         default=0),
    "runtime_env": honoured("its env_vars are set in the validation process (other keys "
                            "as in worker_runtime_env)"),
    **{name: ignored(_VALIDATION_PLACE) for name in (
        "num_cpus", "memory", "resources", "accelerator_type", "label_selector",
        "scheduling_strategy", "placement_group", "placement_group_bundle_index",
        "placement_group_capture_child_tasks", "object_store_memory", "name",
        "enable_task_events", "_metadata")},
    "max_retries": refused("a failed validation is not retried here (its checkpoint is "
                           "VALIDATION_FAILED): retry inside the validation function", default=0),
    "retry_exceptions": refused("a failed validation is not retried here (its checkpoint is "
                                "VALIDATION_FAILED): retry inside the validation function",
                                default=False),
    OTHER: refused("it is not a Ray task option we know: drop it"),
}


def _strict() -> bool:
    return env_vars.Switches.from_environ().ray_strict


def notes_of(holder: Any) -> dict[str, str]:
    """The ignored arguments noted on ``holder`` so far, ``{label: warning}`` (kept in the
    object's ``__dict__``: no dataclass field, so not compared, printed or stored)."""
    return holder.__dict__.setdefault(_NOTES, {})


def note_ignored(notes: dict[str, str], label: str, instead: str,
                 field: str | None = None) -> None:
    """Notes in ``notes`` that ``label`` (``"ScalingConfig(placement_strategy='SPREAD')"``)
    is ignored, for :func:`warn_ignored`; under ``ELASTIC_TRAIN_RAY_STRICT=1`` a
    ``ConfigError`` about ``field`` instead."""
    if _strict():
        raise ConfigError(f"{label} is a Ray setting with no counterpart here: {instead}. "
                          "It is refused because ELASTIC_TRAIN_RAY_STRICT=1 is set (unset "
                          "it to accept it with a warning).", field=field)
    notes[label] = f"{label} is ignored: {instead}."


def _sort(field: str, label: str, value: Any, argument: RayArgument,
          notes: dict[str, str]) -> bool:
    """Whether ``value`` is to be honoured: False for Ray's default and for an ignored
    argument (noted); a refused one raises (about ``field``, ``"ScalingConfig.use_tpu"``)."""
    if value == argument.default:
        return False
    if argument.kind is Kind.REFUSED:
        raise ConfigError(f"{label} is a Ray setting with no counterpart here: "
                          f"{argument.says}.", field=field)
    if argument.kind is Kind.IGNORED:
        note_ignored(notes, label, argument.says, field)
        return False
    return True


def _field(owner: str) -> str:
    """``"ScalingConfig.resources_per_worker"`` of ``"ScalingConfig(resources_per_worker"``."""
    return owner.split("[")[0].replace("(", ".")


def sort_keys(notes: dict[str, str], owner: str, given: Mapping[str, Any],
              table: dict[str, RayArgument]) -> dict[str, Any]:
    """The keys of Ray's dict argument ``owner`` (``"ValidationConfig(ray_remote_kwargs"``,
    which makes labels such as ``ValidationConfig(ray_remote_kwargs['num_cpus']=1)``)
    sorted by ``table`` (its :data:`OTHER` entry for a key it does not name): refused ones
    raise, ignored ones are noted in ``notes``; returns the honoured ones."""
    field = _field(owner)
    return {key: value for key, value in given.items()
            if _sort(field, f"{owner}[{key!r}]={value!r})", value,
                     table.get(key, table[OTHER]), notes)}


def env_vars_of(notes: dict[str, str], owner: str, runtime_env: Any) -> dict[str, str]:
    """The ``env_vars`` of Ray's ``runtime_env`` dict given as ``owner``, checked; its other
    keys sorted by :data:`RUNTIME_ENV`."""
    if runtime_env is None:
        return {}
    if not isinstance(runtime_env, Mapping):
        raise ConfigError(f"{owner}={runtime_env!r}) must be a dict such as "
                          "{'env_vars': {'NCCL_SOCKET_IFNAME': 'eth0'}}.", field=_field(owner))
    kept = sort_keys(notes, owner, runtime_env, RUNTIME_ENV)
    variables = kept.get("env_vars") or {}
    if not (isinstance(variables, Mapping) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in variables.items())):
        raise ConfigError(f"{owner}['env_vars']={variables!r}) must map names to strings, as "
                          "in Ray, e.g. {'env_vars': {'NCCL_DEBUG': 'INFO'}}.",
                          field=_field(owner))
    if ours := sorted(k for k in variables if env_vars.is_ours(k)):
        raise ConfigError(f"{owner}['env_vars']) sets {ours}: they configure the driver and "
                          "its agent, not the workers; set them in the driver's environment.",
                          field=_field(owner))
    return dict(variables)


def takes_ray_arguments(table: dict[str, RayArgument]) -> Callable[[T], T]:
    """Class decorator: the class's ``__init__`` takes the arguments of ``table`` too, and
    does with each what the table says (see the module docstring)."""

    def decorate(cls: T) -> T:
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            notes: dict[str, str] = {}
            for name in [n for n in kwargs if n in table]:
                value, argument = kwargs.pop(name), table[name]
                if _sort(f"{cls.__name__}.{name}", f"{cls.__name__}({name}={value!r})", value,
                         argument, notes):
                    argument.apply(kwargs, value, notes)
            init(self, *args, **kwargs)
            notes_of(self).update(notes)

        cls.__init__ = __init__
        return cls

    return decorate


def warn_ignored(*holders: Any) -> None:
    """Logs, once each, the warnings of the Ray arguments ``holders`` took and ignore
    (the trainer's configs, at ``fit()`` in the driver: once per argument per run)."""
    seen: dict[str, str] = {}
    for holder in holders:
        seen.update(getattr(holder, _NOTES, {}))
    for message in seen.values():
        logger.warning("%s (ELASTIC_TRAIN_RAY_STRICT=1 makes this an error.)", message)
