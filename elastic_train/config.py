"""Run configuration: the dataclasses a user passes to a trainer.

They mirror ``ray.train``'s ``ScalingConfig``, ``RunConfig``, ``FailureConfig``
and ``CheckpointConfig`` (names, arguments, defaults); ``MetricsConfig`` is our addition
(the run's metric exporters). Each validates itself in
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

import contextlib
import dataclasses
import ipaddress
import math
import os
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from elastic_train._internal.ray_arguments import (
    CHECKPOINT_CONFIG,
    FAILURE_CONFIG,
    RESOURCES_PER_WORKER,
    RUN_CONFIG,
    SCALING_CONFIG,
    env_vars_of,
    notes_of,
    sort_keys,
    takes_ray_arguments,
)
from elastic_train.errors import ConfigError
from elastic_train.rendezvous_config import RendezvousConfig
from elastic_train.stragglers import StragglerConfig

DEFAULT_STORAGE_PATH = os.path.join("~", "elastic_train_results")


def _is_whole(x: float) -> bool:
    return abs(x - round(x)) < 1e-6


def _is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1


def _is_bare_host(address: Any) -> bool:
    """Whether ``address`` names a host alone: an IP address (IPv6 too), or a host name
    without a port, a scheme or a path."""
    if not isinstance(address, str) or not address:
        return False
    with contextlib.suppress(ValueError):
        return bool(ipaddress.ip_address(address))
    return not any(c in address for c in ":/[]@ ")


def _require(field: str, condition: bool, message: str) -> None:
    """Raises a ConfigError about ``field`` (``"FailureConfig.max_failures"``) unless
    ``condition`` holds."""
    if not condition:
        raise ConfigError(message, field=field)


@takes_ray_arguments(SCALING_CONFIG)
@dataclass
class ScalingConfig:
    """How many workers to run, what each one gets, and, across nodes, how they meet.

    Args:
        num_workers: Number of worker processes (ranks) in the whole job, as in
            Ray. Ray Train's v1 default of ``None`` means one worker; so does
            ours. ``(min, max)`` makes the job elastic, as in Ray Train v2: it
            keeps training while at least ``min`` workers are left and takes
            nodes back up to ``max`` (needs ``num_workers_per_node``).
        use_gpu: Give each worker a GPU and use NCCL by default.
        resources_per_worker: ``{"CPU": n, "GPU": g}``. ``CPU`` sets each
            worker's torch thread count (default: the machine's cores split
            evenly between the workers, never oversubscribed). ``GPU`` may be
            fractional: ``0.5`` puts two workers on one device.

        num_workers_per_node: Our addition: workers each node runs (torchrun's
            ``--nproc-per-node``). ``None`` (default): all of ``num_workers`` on
            this one node. Each bound of ``num_workers`` must be a multiple of it.
        rendezvous: Our addition: where the nodes meet, a
            :class:`RendezvousConfig` (torchrun's ``--rdzv-*``); needed when
            the job spans more than one node.
        spare_nodes: Our addition (Ray Train has no spares): how many *hot spares*
            the job has (``elastic-train launch --spares``): nodes beyond its size
            (``max`` nodes) that wait parked and take a lost node's place at the next
            rendezvous, so the world size is kept. Start them as every other node, with
            the same settings: the first nodes to meet train, the others wait (torch's
            own mechanism for nodes beyond ``--nnodes MAX``). Needs an elastic
            rendezvous (``c10d``, ``etcd``, ``etcd-v3``). Default 0.

    Across nodes, run the same driver script on every node; the settings map
    to torchrun's flags as ``--nproc-per-node = num_workers_per_node``,
    ``--nnodes = num_workers // num_workers_per_node`` (``MIN:MAX`` for a
    ``(min, max)``), and ``--rdzv-backend/-endpoint/-id/-conf`` from
    ``rendezvous``. Example, 2 to 4 nodes of 8 workers each::

        ScalingConfig(num_workers=(16, 32), num_workers_per_node=8,
                      rendezvous=RendezvousConfig(backend="etcd", endpoint="etcd-host:2379",
                                                  run_id="job42"))

    Ray's ``placement_strategy``, ``trainer_resources``, ``accelerator_type``,
    ``label_selector`` and ``elastic_resize_monitor_interval_s`` (and resources
    other than ``CPU`` and ``GPU``) only place Ray's actors: they are accepted and
    ignored with one warning at ``fit()``; its TPU settings raise ``ConfigError``
    (see :mod:`elastic_train._internal.ray_arguments`).
    """

    num_workers: int | tuple[int, int] | None = None
    use_gpu: bool = False
    resources_per_worker: dict[str, float] | None = None
    num_workers_per_node: int | None = None
    rendezvous: RendezvousConfig | None = None
    spare_nodes: int = 0

    def __post_init__(self) -> None:
        if self.num_workers is None:
            self.num_workers = 1
        if isinstance(self.num_workers, list):
            self.num_workers = tuple(self.num_workers)
        bounds = self.num_workers if isinstance(self.num_workers, tuple) else (self.num_workers,)
        _require(
            "ScalingConfig.num_workers",
            len(bounds) in (1, 2) and all(_is_count(b) for b in bounds) and bounds[0] <= bounds[-1],
            f"ScalingConfig.num_workers={self.num_workers!r} is invalid: it must be an integer "
            ">= 1, or (min, max) with 1 <= min <= max, e.g. ScalingConfig(num_workers=2).",
        )
        self._check_nodes()
        self._check_spares()
        _require(
            "ScalingConfig.resources_per_worker",
            self.resources_per_worker is None or isinstance(self.resources_per_worker, dict),
            f"ScalingConfig.resources_per_worker={self.resources_per_worker!r} must be a dict "
            "such as {'CPU': 2, 'GPU': 0.5}.",
        )
        resources = dict(self.resources_per_worker or {})
        sort_keys(notes_of(self), "ScalingConfig(resources_per_worker",
                  {k: v for k, v in resources.items() if k not in ("CPU", "GPU")},
                  RESOURCES_PER_WORKER)
        resources = {k: v for k, v in resources.items() if k in ("CPU", "GPU")}
        if self.resources_per_worker is not None:
            self.resources_per_worker = resources
        for key, value in resources.items():
            _require(
                "ScalingConfig.resources_per_worker",
                isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0,
                f"ScalingConfig.resources_per_worker[{key!r}]={value!r} is invalid: "
                "it must be a number >= 0.",
            )
        gpus = resources.get("GPU")
        if gpus:
            _require(
                "ScalingConfig.resources_per_worker",
                self.use_gpu,
                f"ScalingConfig.resources_per_worker['GPU']={gpus!r} needs use_gpu=True.",
            )
            _require(
                "ScalingConfig.resources_per_worker",
                _is_whole(1 / gpus if gpus < 1 else gpus),
                f"ScalingConfig.resources_per_worker['GPU']={gpus!r} cannot be packed on whole "
                "devices: use a whole number, or a fraction 1/n such as 0.5 or 0.25.",
            )
        cpus = resources.get("CPU")
        if cpus is not None:
            _require(
                "ScalingConfig.resources_per_worker",
                float(cpus).is_integer() and cpus >= 1,
                f"ScalingConfig.resources_per_worker['CPU']={cpus!r} is invalid: "
                "it sets torch's thread count, so use a whole number >= 1.",
            )

    def _check_nodes(self) -> None:
        _require(
            "ScalingConfig.rendezvous",
            self.rendezvous is None or isinstance(self.rendezvous, RendezvousConfig),
            f"ScalingConfig.rendezvous={self.rendezvous!r} must be a RendezvousConfig.",
        )
        per_node = self.num_workers_per_node
        if per_node is None:
            _require(
                "ScalingConfig.num_workers_per_node",
                not isinstance(self.num_workers, tuple),
                f"ScalingConfig(num_workers={self.num_workers!r}) is elastic across nodes: "
                "say how many workers each node runs, e.g. num_workers_per_node=2 "
                "(torchrun's --nproc-per-node).",
            )
            return
        _require(
            "ScalingConfig.num_workers_per_node",
            _is_count(per_node),
            f"ScalingConfig.num_workers_per_node={per_node!r} is invalid: use an integer >= 1 "
            "(torchrun's --nproc-per-node), or None for a single node.",
        )
        _require(
            "ScalingConfig.num_workers_per_node",
            self.min_workers % per_node == 0 and self.max_workers % per_node == 0,
            f"ScalingConfig(num_workers={self.num_workers!r}, num_workers_per_node={per_node}): "
            "num_workers must be a multiple of num_workers_per_node (whole nodes), e.g. "
            f"num_workers={max(1, self.max_workers // per_node) * per_node}.",
        )
        if self.nodes[1] > 1:
            if self.rendezvous is None:
                self.rendezvous = RendezvousConfig()  # from torchrun's PET_* variables, if set
            self.rendezvous.check_multi_node(
                f"ScalingConfig(num_workers={self.num_workers!r}, "
                f"num_workers_per_node={per_node})")

    def _check_spares(self) -> None:
        spares = self.spare_nodes
        _require(
            "ScalingConfig.spare_nodes",
            isinstance(spares, int) and not isinstance(spares, bool) and spares >= 0,
            f"ScalingConfig.spare_nodes={spares!r} is invalid: use a number of nodes >= 0 "
            "(0: no spares), e.g. spare_nodes=1.",
        )
        rdzv = self.rendezvous
        _require(
            "ScalingConfig.spare_nodes",
            not spares or (rdzv is not None and rdzv.is_elastic and not rdzv.is_local
                           and not rdzv.missing_for_multi_node()),
            f"ScalingConfig.spare_nodes={spares!r} needs a rendezvous that every node joins, "
            "where the spares wait to take a lost node's place: an elastic backend with an "
            "endpoint and a run id, e.g. RendezvousConfig(backend='etcd', "
            "endpoint='etcd-host:2379', run_id='job42') (launch: --rdzv-backend etcd "
            "--rdzv-endpoint HOST:PORT --rdzv-id ID), the same on every node.",
        )

    def without_secrets(self) -> ScalingConfig:
        """This config without the rendezvous password, for what is stored (run.json,
        trainable.pkl): like storage credentials, it is never written down."""
        if self.rendezvous is None:
            return self
        return dataclasses.replace(self, rendezvous=self.rendezvous.without_secrets())

    @property
    def min_workers(self) -> int:
        """The fewest workers the job trains with (``num_workers``, or its ``min``)."""
        return self.num_workers[0] if isinstance(self.num_workers, tuple) else self.num_workers

    @property
    def max_workers(self) -> int:
        """The most workers the job trains with (``num_workers``, or its ``max``)."""
        return self.num_workers[-1] if isinstance(self.num_workers, tuple) else self.num_workers

    @property
    def workers_per_node(self) -> int:
        """Workers on each node: ``num_workers_per_node``, else all of them on one node."""
        return self.num_workers_per_node or self.max_workers

    @property
    def nodes(self) -> tuple[int, int]:
        """(min, max) nodes of the job: torchrun's ``--nnodes MIN:MAX``."""
        return self.min_workers // self.workers_per_node, self.max_workers // self.workers_per_node

    @property
    def spans_nodes(self) -> bool:
        """Whether more than one node meets at the rendezvous (the job's, or a spare)."""
        return self.nodes[1] + self.spare_nodes > 1

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
        return math.ceil(self.workers_per_node * self.gpus_per_worker - 1e-9)


@takes_ray_arguments(FAILURE_CONFIG)
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
        restart_in_process: Our addition (Ray restarts worker processes): after
            a failure the surviving workers stay alive, leave the train function,
            form the process group again and call the train function again in
            the same process (a dead rank gets a new worker forked from the warm
            zygote). Much faster than new processes -- the interpreter, imports
            and, on GPUs, the CUDA context survive -- but module-level state of
            the user's code survives too, where under Ray it would not. The
            restart is charged like any other. ``False``: every restart starts
            new worker processes, as Ray and torchrun do. See docs/fault-tolerance.md,
            "Restarts in process".
        unwind_timeout_s: Our addition: with ``restart_in_process``, how long a
            surviving worker may take to leave the train function after a failure
            (a hang with the GIL held, a wedged C++ call); a worker that takes
            longer, or whose device is unhealthy, is killed and replaced.
        max_restarts_without_progress: Our addition: the run stops, even with
            ``max_failures=-1``, after this many consecutive restarts that brought
            neither a new committed checkpoint nor a report past the furthest
            iteration reached (restarts after preemptions do not count). It
            raises :class:`~elastic_train.errors.NoProgressError`, and
            ``elastic-train launch`` exits with code 3, so that Slurm requeue and
            Kubernetes restart policies stop retrying a failure that repeats.
            ``-1`` turns the guard off.

    Ray's ``fail_fast=True`` (or ``"raise"``) is taken as ``max_failures=0``.
    """

    max_failures: int = 0
    hang_timeout_s: float | None = None
    max_preemption_failures: int = -1
    preemption_grace_s: float = 25.0
    restart_in_process: bool = True
    unwind_timeout_s: float = 10.0
    max_restarts_without_progress: int = 3

    def __post_init__(self) -> None:
        _require(
            "FailureConfig.hang_timeout_s",
            self.hang_timeout_s is None
            or (isinstance(self.hang_timeout_s, (int, float)) and self.hang_timeout_s > 0),
            f"FailureConfig.hang_timeout_s={self.hang_timeout_s!r} is invalid: use a number "
            "of seconds > 0, longer than your slowest step, or None (off).",
        )
        _require(
            "FailureConfig.max_failures",
            isinstance(self.max_failures, int) and not isinstance(self.max_failures, bool)
            and self.max_failures >= -1,
            f"FailureConfig.max_failures={self.max_failures!r} is invalid: use 0 for no "
            "retries, a positive number of retries, or -1 for unlimited retries.",
        )
        _require(
            "FailureConfig.max_preemption_failures",
            isinstance(self.max_preemption_failures, int)
            and not isinstance(self.max_preemption_failures, bool)
            and self.max_preemption_failures >= -1,
            f"FailureConfig.max_preemption_failures={self.max_preemption_failures!r} is invalid: "
            "use -1 (unlimited, the default), 0 or a positive number of restarts.",
        )
        _require(
            "FailureConfig.preemption_grace_s",
            isinstance(self.preemption_grace_s, (int, float))
            and not isinstance(self.preemption_grace_s, bool) and self.preemption_grace_s >= 0,
            f"FailureConfig.preemption_grace_s={self.preemption_grace_s!r} is invalid: use a "
            "number of seconds >= 0, shorter than your scheduler's own grace period.",
        )
        _require(
            "FailureConfig.restart_in_process",
            isinstance(self.restart_in_process, bool),
            f"FailureConfig.restart_in_process={self.restart_in_process!r} is invalid: use True "
            "(restart the train function in the surviving processes) or False (new processes).",
        )
        _require(
            "FailureConfig.unwind_timeout_s",
            isinstance(self.unwind_timeout_s, (int, float))
            and not isinstance(self.unwind_timeout_s, bool) and self.unwind_timeout_s > 0,
            f"FailureConfig.unwind_timeout_s={self.unwind_timeout_s!r} is invalid: use a number "
            "of seconds > 0, e.g. 10.",
        )
        _require(
            "FailureConfig.max_restarts_without_progress",
            isinstance(self.max_restarts_without_progress, int)
            and not isinstance(self.max_restarts_without_progress, bool)
            and (self.max_restarts_without_progress >= 1
                 or self.max_restarts_without_progress == -1),
            f"FailureConfig.max_restarts_without_progress={self.max_restarts_without_progress!r} "
            "is invalid: use a number of restarts >= 1 (default 3), or -1 to turn the guard off.",
        )

    @property
    def max_restarts(self) -> int:
        """The budget as torch.distributed.elastic's ``max_restarts`` (unlimited = 2**31-1)."""
        return 2**31 - 1 if self.max_failures == -1 else self.max_failures


@takes_ray_arguments(CHECKPOINT_CONFIG)
@dataclass
class CheckpointConfig:
    """Which checkpoints to keep.

    Args:
        num_to_keep: Keep at most this many checkpoints, ranked by
            ``checkpoint_score_attribute`` (or by recency without one). The
            latest checkpoint is always kept as well, so a run can resume, and
            so is one whose asynchronous validation is pending.
            ``None`` keeps all.
        checkpoint_score_attribute: A metric reported with each checkpoint, or one
            its asynchronous validation returns (``report(validation=...)``).
        checkpoint_score_order: ``"max"`` (default, as in Ray) or ``"min"``.
        peer_replicas: Our addition to Ray (Ray keeps no node-local copies): with a
            remote store and more than one node, each node's uploaded checkpoint files
            also go to this many peer nodes (the next ones in node-rank order, a
            ring), so that a replacement node, or one whose disk was wiped, restores
            its share from a peer over the network instead of the store (see
            :mod:`elastic_train.storage.peer_replicas`); each node's disk then also
            holds K other nodes' shares of the newest checkpoint. ``0`` turns it
            off. ``elastic-train launch --peer-replicas K``.

    Example::

        CheckpointConfig(num_to_keep=2, peer_replicas=1)
    """

    num_to_keep: int | None = None
    checkpoint_score_attribute: str | None = None
    checkpoint_score_order: str = "max"
    peer_replicas: int = 1

    def __post_init__(self) -> None:
        _require(
            "CheckpointConfig.num_to_keep",
            self.num_to_keep is None
            or (isinstance(self.num_to_keep, int) and not isinstance(self.num_to_keep, bool)
                and self.num_to_keep >= 1),
            f"CheckpointConfig.num_to_keep={self.num_to_keep!r} is invalid: use an integer "
            ">= 1, or None to keep every checkpoint.",
        )
        _require(
            "CheckpointConfig.checkpoint_score_order",
            self.checkpoint_score_order in ("max", "min"),
            f"CheckpointConfig.checkpoint_score_order={self.checkpoint_score_order!r} is "
            "invalid: use 'max' or 'min'.",
        )
        _require(
            "CheckpointConfig.checkpoint_score_attribute",
            self.checkpoint_score_attribute is None
            or (isinstance(self.checkpoint_score_attribute, str)
                and self.checkpoint_score_attribute),
            f"CheckpointConfig.checkpoint_score_attribute={self.checkpoint_score_attribute!r} "
            "is invalid: use the name of a reported metric, or None.",
        )
        _require(
            "CheckpointConfig.peer_replicas",
            isinstance(self.peer_replicas, int) and not isinstance(self.peer_replicas, bool)
            and self.peer_replicas >= 0,
            f"CheckpointConfig.peer_replicas={self.peer_replicas!r} is invalid: use the number "
            "of peer nodes that keep a copy of each node's checkpoint files (an integer >= 0; "
            "0 turns copies off), e.g. CheckpointConfig(peer_replicas=1).",
        )


@dataclass(frozen=True)
class MetricsConfig:
    """The run's metric exporters (our addition; Ray Train exports only to its own dashboard),
    both opt-in and off by default: no port opened, no thread started, nothing imported that
    the ``metrics``/``otel`` extras install. The figures and their names:
    :mod:`elastic_train.driver.node_metrics`; how to turn each on: docs/observability.md.

    Example::

        RunConfig(metrics_config=MetricsConfig(port=9464, otlp_endpoint="http://c:4318"))
        # elastic-train launch --metrics-port 9464 --otlp-endpoint http://c:4318 ...

    Args:
        port: Serve Prometheus's text format at ``http://<node>:<port>/metrics`` from each
            node's driver (None, the default: no endpoint). 1024-65535; a port that is
            taken is refused before any process starts. ``launch --metrics-port``.
        address: The host name or IP address the endpoint listens on, without a port
            (the port is ``port``). The default, ``127.0.0.1``, serves a scraper on the
            node itself only; name the address a remote scraper reaches (``0.0.0.0``:
            every interface) to open it to the network (docs/SECURITY.md).
            ``launch --metrics-address``.
        otlp_endpoint: Push the same metrics over OTLP/HTTP to this collector, e.g.
            ``http://collector:4318`` (``/v1/metrics`` is added when the URL has no path).
            None, the default: no push. ``launch --otlp-endpoint``.
        otlp_interval_s: Seconds between two pushes (default 10).
    """

    port: int | None = None
    address: str = "127.0.0.1"
    otlp_endpoint: str | None = None
    otlp_interval_s: float = 10.0

    def __post_init__(self) -> None:
        port = self.port
        if port is not None and not (isinstance(port, int) and not isinstance(port, bool)
                                     and 1024 <= port <= 65535):
            raise ConfigError(
                f"MetricsConfig.port={port!r} is invalid: use a free port from 1024 to 65535 "
                "(ports below 1024 are privileged), e.g. MetricsConfig(port=9464) or "
                "launch --metrics-port 9464, or None for no endpoint.",
                field="MetricsConfig.port")
        if not _is_bare_host(self.address):
            given = str(self.address)
            host = urllib.parse.urlsplit(given if "://" in given else f"//{given}"
                                         ).hostname or "127.0.0.1"
            raise ConfigError(
                f"MetricsConfig.address={self.address!r} is invalid: give a host name or IP "
                "address without a port (the port is MetricsConfig.port), e.g. "
                f"MetricsConfig(address='{host}', port={port or 9464}).",
                field="MetricsConfig.address")
        endpoint = self.otlp_endpoint
        if endpoint is not None and not (isinstance(endpoint, str) and urllib.parse.urlsplit(
                endpoint).scheme in ("http", "https") and urllib.parse.urlsplit(endpoint).netloc):
            raise ConfigError(
                f"MetricsConfig.otlp_endpoint={endpoint!r} is invalid: use the collector's "
                "OTLP/HTTP URL, e.g. 'http://collector:4318', or None for no push.",
                field="MetricsConfig.otlp_endpoint")
        interval = self.otlp_interval_s
        if not (isinstance(interval, (int, float)) and not isinstance(interval, bool)
                and interval > 0):
            raise ConfigError(
                f"MetricsConfig.otlp_interval_s={interval!r} is invalid: use a number of "
                "seconds > 0, e.g. 10.", field="MetricsConfig.otlp_interval_s")

    @property
    def enabled(self) -> bool:
        """Whether any exporter is on."""
        return self.port is not None or self.otlp_endpoint is not None

    @property
    def otlp_url(self) -> str | None:
        """The collector's metrics URL: ``otlp_endpoint``, with ``/v1/metrics`` when it has
        no path of its own."""
        if self.otlp_endpoint is None:
            return None
        parts = urllib.parse.urlsplit(self.otlp_endpoint)
        return self.otlp_endpoint if parts.path.strip("/") else \
            self.otlp_endpoint.rstrip("/") + "/v1/metrics"


@takes_ray_arguments(RUN_CONFIG)
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
        straggler_config: Our addition: when a node that stays slow is named in the
            console and ``run.json``; see :class:`~elastic_train.StragglerConfig`.
        metrics_config: Our addition: a Prometheus endpoint on each node and an
            OpenTelemetry push, both off by default; see
            :class:`~elastic_train.MetricsConfig` and docs/observability.md.
        start_over: Our addition. A run stored under this name that cannot be
            continued -- it finished, or its train function changed (see
            :mod:`elastic_train.driver.resume_rules`) -- is refused by default. With
            ``True`` it is moved aside to ``<name>.<status>-<UTC time>`` (never
            deleted; on object stores copied whole, then removed) and a fresh
            run starts under the name. A run that can be continued is still
            continued, so a script that always passes it resumes after a crash.
            Ray Train v2 instead hands a finished run's latest checkpoint to the
            train function again (which then usually returns at once) and
            offers no way to start over but a new name or deleting the folder.
        worker_runtime_env: Ray's, ``{"env_vars": {"NAME": "value"}}``: the
            variables are set in every worker (and validation process) before the
            train function starts. Not stored with the run (they may hold secrets,
            as ``storage_options`` do): ``TorchTrainer.restore(path)`` runs without
            them, so set them in the driver's environment for it (workers inherit
            it). Ray's other keys that would run other code than the driver's
            (``pip``, ``conda``, ``working_dir``...) raise ``ConfigError``; Ray's
            older name ``runtime_env`` is taken too.
    """

    name: str | None = None
    storage_path: str | None = None
    storage_filesystem: Any = None
    storage_options: dict[str, Any] | None = field(default=None, repr=False)
    storage_retry_timeout_s: float = 120.0
    failure_config: FailureConfig | None = None
    checkpoint_config: CheckpointConfig | None = None
    straggler_config: StragglerConfig | None = None
    metrics_config: MetricsConfig | None = None
    callbacks: list[Any] | None = None
    verbose: int = 1
    start_over: bool = False
    worker_runtime_env: dict[str, Any] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        variables = env_vars_of(notes_of(self), "RunConfig(worker_runtime_env",
                                self.worker_runtime_env)
        self.worker_runtime_env = {"env_vars": variables} if variables else None
        self._check_parts()
        if self.storage_path is None:
            self.storage_path = DEFAULT_STORAGE_PATH
        _require(
            "RunConfig.storage_path",
            isinstance(self.storage_path, (str, os.PathLike)),
            f"RunConfig.storage_path={self.storage_path!r} must be a path or URL string.",
        )
        self.storage_path = os.fspath(self.storage_path)
        self.callbacks = list(self.callbacks or [])
        _require("RunConfig.verbose", self.verbose in (0, 1, 2),
                 f"RunConfig.verbose={self.verbose!r} is invalid: use 0, 1 or 2.")
        _require(
            "RunConfig.storage_options",
            self.storage_options is None or isinstance(self.storage_options, dict),
            "RunConfig.storage_options must be a dict of fsspec filesystem arguments.",
        )
        _require(
            "RunConfig.storage_retry_timeout_s",
            isinstance(self.storage_retry_timeout_s, (int, float))
            and self.storage_retry_timeout_s >= 0,
            f"RunConfig.storage_retry_timeout_s={self.storage_retry_timeout_s!r} is invalid: "
            "use a number of seconds >= 0.",
        )
        _require("RunConfig.start_over", isinstance(self.start_over, bool),
                 f"RunConfig.start_over={self.start_over!r} is invalid: use True or False.")
        _require(
            "RunConfig.name",
            self.name is None or (isinstance(self.name, str) and self.name.strip("./") != ""
                                  and "/" not in self.name),
            f"RunConfig.name={self.name!r} is invalid: use a non-empty name without '/', "
            "e.g. RunConfig(name='resnet-fashion').",
        )

    def _check_parts(self) -> None:
        """The settings' own configs: their defaults, and each of the right type."""
        for name, kind in (("failure_config", FailureConfig),
                           ("checkpoint_config", CheckpointConfig),
                           ("straggler_config", StragglerConfig),
                           ("metrics_config", MetricsConfig)):
            if getattr(self, name) is None:
                setattr(self, name, kind())
            _require(f"RunConfig.{name}", isinstance(getattr(self, name), kind),
                     f"RunConfig.{name}={getattr(self, name)!r} must be a {kind.__name__}.")

    @property
    def worker_env_vars(self) -> dict[str, str]:
        """The variables ``worker_runtime_env`` sets in every worker."""
        return dict((self.worker_runtime_env or {}).get("env_vars", {}))


def check_together(run_config: RunConfig, scaling: ScalingConfig) -> None:
    """The rules between the configs, which neither can check alone; checked once, on the
    node-run path both front-ends take (:class:`~elastic_train.driver.node_run.NodePlan`),
    before any process starts."""
    stragglers = run_config.straggler_config
    _require(
        "StragglerConfig.replace",
        not (stragglers is not None and stragglers.replace) or scaling.spare_nodes > 0,
        "StragglerConfig.replace=True (launch: --replace-stragglers) replaces a straggler "
        f"with a spare, but ScalingConfig.spare_nodes={scaling.spare_nodes} (launch: "
        "--spares) declares none: declare spares and start that many more nodes, e.g. "
        "ScalingConfig(spare_nodes=1) or launch --spares 1, or drop replace=True "
        "(--replace-stragglers) to only name stragglers.",
    )
