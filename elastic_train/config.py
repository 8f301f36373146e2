"""Run configuration: the dataclasses a user passes to a trainer.

They mirror ``ray.train``'s ``ScalingConfig``, ``RunConfig``, ``FailureConfig``
and ``CheckpointConfig`` (names, arguments, defaults). Each validates itself in
``__post_init__`` so that a bad value fails in the driver, before any process
starts, with a message that names the field, the value and the fix.

Example::

    from elastic_train import ScalingConfig, RunConfig, FailureConfig, CheckpointConfig

    scaling = ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1})
    run = RunConfig(
        name="digits",
        storage_path="/tmp/results",
        failure_config=FailureConfig(max_failures=3),
        checkpoint_config=CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="loss",
                                           checkpoint_score_order="min"),
    )
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from elastic_train.errors import ConfigError

DEFAULT_STORAGE_PATH = os.path.join("~", "elastic_train_results")


def _is_whole(x: float) -> bool:
    return abs(x - round(x)) < 1e-6


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


@dataclass
class ScalingConfig:
    """How many workers to run and what each one gets.

    Args:
        num_workers: Number of worker processes (ranks). Ray Train's v1 default
            of ``None`` means one worker; so does ours.
        use_gpu: Give each worker a GPU and use NCCL by default.
        resources_per_worker: ``{"CPU": n, "GPU": g}``. ``CPU`` sets each
            worker's torch thread count (default: the machine's cores split
            evenly between the workers, never oversubscribed). ``GPU`` may be
            fractional: ``0.5`` puts two workers on one device.

    Ray's ``placement_strategy``, ``trainer_resources`` and
    ``accelerator_type`` are scheduling hints for a Ray cluster; there is no
    such scheduler under torch.distributed.elastic, so they are not accepted.
    """

    num_workers: int | None = None
    use_gpu: bool = False
    resources_per_worker: dict[str, float] | None = None

    def __post_init__(self) -> None:
        if self.num_workers is None:
            self.num_workers = 1
        _require(
            isinstance(self.num_workers, int) and not isinstance(self.num_workers, bool)
            and self.num_workers >= 1,
            f"ScalingConfig.num_workers={self.num_workers!r} is invalid: "
            "it must be an integer >= 1, e.g. ScalingConfig(num_workers=2).",
        )
        _require(
            self.resources_per_worker is None or isinstance(self.resources_per_worker, dict),
            f"ScalingConfig.resources_per_worker={self.resources_per_worker!r} must be a dict "
            "such as {'CPU': 2, 'GPU': 0.5}.",
        )
        resources = dict(self.resources_per_worker or {})
        for key, value in resources.items():
            _require(
                key in ("CPU", "GPU"),
                f"ScalingConfig.resources_per_worker has unknown resource {key!r}: "
                "only 'CPU' and 'GPU' are understood.",
            )
            _require(
                isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0,
                f"ScalingConfig.resources_per_worker[{key!r}]={value!r} is invalid: "
                "it must be a number >= 0.",
            )
        gpus = resources.get("GPU")
        if gpus:
            _require(
                self.use_gpu,
                f"ScalingConfig.resources_per_worker['GPU']={gpus!r} needs use_gpu=True.",
            )
            _require(
                _is_whole(1 / gpus if gpus < 1 else gpus),
                f"ScalingConfig.resources_per_worker['GPU']={gpus!r} cannot be packed on whole "
                "devices: use a whole number, or a fraction 1/n such as 0.5 or 0.25.",
            )
        cpus = resources.get("CPU")
        if cpus is not None:
            _require(
                float(cpus).is_integer() and cpus >= 1,
                f"ScalingConfig.resources_per_worker['CPU']={cpus!r} is invalid: "
                "it sets torch's thread count, so use a whole number >= 1.",
            )

    @property
    def gpus_per_worker(self) -> float:
        """GPUs each worker gets: ``resources_per_worker['GPU']``, or 1 with ``use_gpu``."""
        if not self.use_gpu:
            return 0.0
        return float((self.resources_per_worker or {}).get("GPU", 1))

    def threads_per_worker(self, workers_on_node: int, cores: int | None = None) -> int:
        """Torch threads for each worker: the ``CPU`` resource, else an even split of the cores."""
        cpus = (self.resources_per_worker or {}).get("CPU")
        if cpus is not None:
            return int(cpus)
        return max(1, (cores or os.cpu_count() or 1) // workers_on_node)

    def gpus_needed(self) -> int:
        """Whole devices the workers of one node occupy together."""
        return math.ceil(self.num_workers * self.gpus_per_worker - 1e-9)


@dataclass
class FailureConfig:
    """How many worker-group failures to survive.

    Args:
        max_failures: Restarts allowed after a worker raises, exits non-zero or
            is killed. ``0`` (the default, as in Ray) fails at the first
            error; ``-1`` retries without limit. Each restart relaunches the
            whole group, which resumes from the latest committed checkpoint.
        hang_timeout_s: Our addition (Ray has none): a worker that makes no
            progress -- no ``report()``, no batch from a dataset shard or a
            prepared data loader -- for this long is declared hung; the agent
            saves every stale rank's Python stack, stops the group and restarts
            it like a crash (instead of waiting 30 minutes for a collective's
            timeout). The clock starts at a worker's first report or batch;
            start-up before it (imports, model, checkpoint loading) gets 120 s
            more. ``None`` (default) turns it off.
        max_preemption_failures: Restarts allowed after a node was preempted
            (its workers got a SIGTERM notice, then were stopped), as in Ray
            Train v2; they do not spend ``max_failures``. ``-1`` (default):
            unlimited.
        preemption_grace_s: Our addition: when the agent itself gets a
            SIGTERM, its workers get the notice and this long to commit a
            just-in-time checkpoint (see :func:`elastic_train.get_preemption_info`)
            before they are killed. The default, 25 s, fits inside
            Kubernetes' default 30 s termination grace period.
    """

    max_failures: int = 0
    hang_timeout_s: float | None = None
    max_preemption_failures: int = -1
    preemption_grace_s: float = 25.0

    def __post_init__(self) -> None:
        _require(
            self.hang_timeout_s is None
            or (isinstance(self.hang_timeout_s, (int, float)) and self.hang_timeout_s > 0),
            f"FailureConfig.hang_timeout_s={self.hang_timeout_s!r} is invalid: use None (off) "
            "or a number of seconds > 0, longer than your slowest step.",
        )
        _require(
            isinstance(self.max_failures, int) and not isinstance(self.max_failures, bool)
            and self.max_failures >= -1,
            f"FailureConfig.max_failures={self.max_failures!r} is invalid: use 0 for no "
            "retries, a positive number of retries, or -1 for unlimited retries.",
        )
        _require(
            isinstance(self.max_preemption_failures, int)
            and not isinstance(self.max_preemption_failures, bool)
            and self.max_preemption_failures >= -1,
            f"FailureConfig.max_preemption_failures={self.max_preemption_failures!r} is invalid: "
            "use -1 (unlimited, the default), 0 or a positive number of restarts.",
        )
        _require(
            isinstance(self.preemption_grace_s, (int, float))
            and not isinstance(self.preemption_grace_s, bool) and self.preemption_grace_s >= 0,
            f"FailureConfig.preemption_grace_s={self.preemption_grace_s!r} is invalid: use a "
            "number of seconds >= 0, shorter than your scheduler's own grace period.",
        )

    @property
    def max_restarts(self) -> int:
        """The budget as torch.distributed.elastic's ``max_restarts`` (unlimited = 2**31-1)."""
        return 2**31 - 1 if self.max_failures == -1 else self.max_failures


@dataclass
class CheckpointConfig:
    """Which checkpoints to keep.

    Args:
        num_to_keep: Keep at most this many checkpoints, ranked by
            ``checkpoint_score_attribute`` (or by recency without one). The
            latest checkpoint is always kept as well, so a run can resume.
            ``None`` keeps all.
        checkpoint_score_attribute: A metric reported with each checkpoint.
        checkpoint_score_order: ``"max"`` (default, as in Ray) or ``"min"``.
    """

    num_to_keep: int | None = None
    checkpoint_score_attribute: str | None = None
    checkpoint_score_order: str = "max"

    def __post_init__(self) -> None:
        _require(
            self.num_to_keep is None
            or (isinstance(self.num_to_keep, int) and not isinstance(self.num_to_keep, bool)
                and self.num_to_keep >= 1),
            f"CheckpointConfig.num_to_keep={self.num_to_keep!r} is invalid: use None to keep "
            "every checkpoint or an integer >= 1.",
        )
        _require(
            self.checkpoint_score_order in ("max", "min"),
            f"CheckpointConfig.checkpoint_score_order={self.checkpoint_score_order!r} is "
            "invalid: use 'max' or 'min'.",
        )
        _require(
            self.checkpoint_score_attribute is None
            or (isinstance(self.checkpoint_score_attribute, str)
                and self.checkpoint_score_attribute),
            f"CheckpointConfig.checkpoint_score_attribute={self.checkpoint_score_attribute!r} "
            "is invalid: use the name of a reported metric, or None.",
        )


@dataclass
class RunConfig:
    """Where a run lives and how it survives failures.

    Args:
        name: The run's directory name under ``storage_path`` (default: a
            timestamped name, as Ray does).
        storage_path: A local path, NFS mount or fsspec URL
            (default ``~/elastic_train_results``).
        storage_filesystem: An ``fsspec`` filesystem to use instead of the
            one the URL implies.
        storage_options: Keyword arguments for the URL's fsspec filesystem
            (for S3: ``endpoint_url``, ``key``, ``secret``, ``client_kwargs``,
            anything s3fs takes). Never written to ``run.json`` or logs.
        storage_retry_timeout_s: How long transient storage errors (refused
            or reset connections, timeouts, 5xx, throttling) are retried, with
            exponential backoff, before the operation fails the run.
        callbacks: Driver-side :class:`~elastic_train.UserCallback` objects
            (e.g. ``CSVLoggerCallback()``, ``TensorBoardLoggerCallback()``).
        verbose: 0 prints nothing but the workers' output, 1 (default) adds a
            live status line (plain periodic lines when stdout is not a
            terminal), 2 also shows torch.distributed.elastic's agent logs.
        failure_config: Restart budget; see :class:`FailureConfig`.
        checkpoint_config: Retention; see :class:`CheckpointConfig`.
        start_over: Our addition. A run stored under this name that cannot be
            continued -- it finished, or its train function changed (see
            :mod:`elastic_train.resume_rules`) -- is refused by default. With
            ``True`` it is moved aside to ``<name>.<status>-<UTC time>`` (never
            deleted; on object stores copied whole, then removed) and a fresh
            run starts under the name. A run that can be continued is still
            continued, so a script that always passes it resumes after a crash.
            Ray Train v2 instead hands a finished run's latest checkpoint to the
            train function again (which then usually returns at once) and
            offers no way to start over but a new name or deleting the folder.
    """

    name: str | None = None
    storage_path: str | None = None
    storage_filesystem: Any = None
    storage_options: dict[str, Any] | None = field(default=None, repr=False)
    storage_retry_timeout_s: float = 120.0
    failure_config: FailureConfig | None = None
    checkpoint_config: CheckpointConfig | None = None
    callbacks: list[Any] | None = None
    verbose: int = 1
    start_over: bool = False

    def __post_init__(self) -> None:
        if self.failure_config is None:
            self.failure_config = FailureConfig()
        if self.checkpoint_config is None:
            self.checkpoint_config = CheckpointConfig()
        if self.storage_path is None:
            self.storage_path = DEFAULT_STORAGE_PATH
        _require(
            isinstance(self.failure_config, FailureConfig),
            f"RunConfig.failure_config={self.failure_config!r} must be a FailureConfig.",
        )
        _require(
            isinstance(self.checkpoint_config, CheckpointConfig),
            f"RunConfig.checkpoint_config={self.checkpoint_config!r} must be a CheckpointConfig.",
        )
        _require(
            isinstance(self.storage_path, (str, os.PathLike)),
            f"RunConfig.storage_path={self.storage_path!r} must be a path or URL string.",
        )
        self.storage_path = os.fspath(self.storage_path)
        self.callbacks = list(self.callbacks or [])
        _require(self.verbose in (0, 1, 2),
                 f"RunConfig.verbose={self.verbose!r} is invalid: use 0, 1 or 2.")
        _require(
            self.storage_options is None or isinstance(self.storage_options, dict),
            "RunConfig.storage_options must be a dict of fsspec filesystem arguments.",
        )
        _require(
            isinstance(self.storage_retry_timeout_s, (int, float))
            and self.storage_retry_timeout_s >= 0,
            f"RunConfig.storage_retry_timeout_s={self.storage_retry_timeout_s!r} is invalid: "
            "use a number of seconds >= 0.",
        )
        _require(isinstance(self.start_over, bool),
                 f"RunConfig.start_over={self.start_over!r} is invalid: use True or False.")
        _require(
            self.name is None or (isinstance(self.name, str) and self.name.strip("./") != ""
                                  and "/" not in self.name),
            f"RunConfig.name={self.name!r} is invalid: use a non-empty name without '/', "
            "e.g. RunConfig(name='resnet-fashion').",
        )
