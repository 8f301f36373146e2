"""``elastic-train launch``'s settings: torchrun's flags (and ours) as the Python API's configs.

One launcher process runs on each node. Its flags -- resolved by the command
line from the flag, ``PET_*``, the platform (Slurm, Kubeflow) or torchrun's
default, each with its source -- become the configuration objects of the
Python API (:class:`~elastic_train.ScalingConfig`,
:class:`~elastic_train.RunConfig`, :class:`~elastic_train.FailureConfig`,
:class:`~elastic_train.CheckpointConfig`,
:class:`~elastic_train.RendezvousConfig`), so every rule is checked once and a
bad value gets the same error as the setting it maps to, with its source
named. torchrun's own rules for its flags are in :mod:`.launch_rules`; the
node's run is :mod:`.launch_run`'s.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, fields

from elastic_train._internal.redaction import redact_conf, redacted_options
from elastic_train._internal.rendezvous_backends import TORCHRUN_DEFAULT, Backend, lookup
from elastic_train.agent.api import DEFAULT_SIGNALS, ProcessOptions
from elastic_train.config import (
    DEFAULT_STORAGE_PATH,
    CheckpointConfig,
    FailureConfig,
    MetricsConfig,
    RunConfig,
    ScalingConfig,
    check_together,
)
from elastic_train.driver import launch_rules as rules
from elastic_train.driver.console import ConsoleView
from elastic_train.errors import ConfigError
from elastic_train.rendezvous_config import LOCAL_ENDPOINT, RendezvousConfig, parse_rdzv_conf
from elastic_train.storage.filesystem import options_from_flags
from elastic_train.stragglers import StragglerConfig

SCRIPT_WORKER = "elastic_train.worker.script_worker"
_FAILURE = FailureConfig()  # the API's defaults, which launch's flags share
_STRAGGLERS = StragglerConfig()
_METRICS = MetricsConfig()
DEFAULT_GRACE_S = _FAILURE.preemption_grace_s

# The setting each config field gets its value from: an error about the field names it.
# Not recorded in run.json's "launch": the checkpoint settings are recorded as
# "checkpoint_config"; --max-failures as the --max-restarts it resolves to; --start-over
# applies to one launch only; the sources are where the values came from on this node,
# and storage options may hold credentials.
_NOT_RECORDED = ("max_failures", "num_to_keep", "checkpoint_score_attribute",
                 "checkpoint_score_order", "peer_replicas",
                 "start_over", "sources", "storage_option")


@dataclass
class LaunchSettings:
    """Everything ``elastic-train launch`` was told: torchrun's flags (with torch's
    defaults), then ours; ``sources`` says where each value came from (``"--nnodes"``,
    ``"PET_NNODES"``, ``"SLURM_JOB_NUM_NODES"``, ``"default"``).

    ``__post_init__`` applies torchrun's rules and turns the values into the
    Python API's configs, the fields after ``sources`` (not arguments):
    :attr:`scaling`, :attr:`rendezvous`, :attr:`run_config` (and :attr:`view`,
    :attr:`process` for the console and the worker processes). ``notes`` are
    one-line messages about flags that are not honoured or values that were
    chosen for the user.
    """

    target: str
    target_args: list[str] = field(default_factory=list)
    nnodes: str = "1:1"
    nproc_per_node: str = "1"
    rdzv_backend: str = TORCHRUN_DEFAULT
    rdzv_endpoint: str = ""
    rdzv_id: str = "none"
    rdzv_conf: str = ""
    standalone: bool = False
    max_restarts: int = 0
    max_failures: int | None = None
    monitor_interval: float = 0.1
    start_method: str = "spawn"
    event_log_handler: str = "null"
    role: str = "default"
    module: bool = False
    no_python: bool = False
    run_path: bool = False
    log_dir: str | None = None
    redirects: str = "0"
    tee: str = "0"
    log_line_prefix_template: str = ""
    local_ranks_filter: str = ""
    duplicate_stdout_filters: list[str] = field(default_factory=list)
    duplicate_stderr_filters: list[str] = field(default_factory=list)
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    local_addr: str | None = None
    logs_specs: str | None = None
    numa_binding: str | None = None
    signals_to_handle: str = DEFAULT_SIGNALS
    shutdown_timeout: int | None = None
    virtual_local_rank: bool = False
    spares: int = 0
    hang_timeout: float | None = None
    preemption_grace: float | None = None
    max_preemption_failures: int = _FAILURE.max_preemption_failures
    no_restart_in_process: bool = False
    unwind_timeout: float = _FAILURE.unwind_timeout_s
    max_restarts_without_progress: int = _FAILURE.max_restarts_without_progress
    straggler_threshold: float = _STRAGGLERS.score_threshold
    straggler_window: int = _STRAGGLERS.window
    straggler_min_excess: float = _STRAGGLERS.min_excess_s
    replace_stragglers: bool = _STRAGGLERS.replace
    straggler_cool_off: float = _STRAGGLERS.cool_off_s
    quiet: bool = False
    verbose: bool = False
    metrics_port: int | None = None
    metrics_address: str = _METRICS.address
    otlp_endpoint: str | None = None
    otlp_interval: float = _METRICS.otlp_interval_s
    storage_path: str = DEFAULT_STORAGE_PATH
    storage_option: list[str] = field(default_factory=list)
    name: str | None = None
    num_to_keep: int | None = None
    checkpoint_score_attribute: str | None = None
    checkpoint_score_order: str = "max"
    peer_replicas: int = CheckpointConfig().peer_replicas
    start_over: bool = False
    sources: dict[str, str] = field(default_factory=dict)
    # Resolved by __post_init__:
    notes: list[str] = field(init=False, repr=False)
    min_nodes: int = field(init=False)
    max_nodes: int = field(init=False)
    workers_per_node: int = field(init=False)
    view: ConsoleView = field(init=False, repr=False)
    process: ProcessOptions = field(init=False, repr=False)
    rendezvous: RendezvousConfig = field(init=False, repr=False)
    scaling: ScalingConfig = field(init=False, repr=False)
    checkpoint: CheckpointConfig = field(init=False, repr=False)
    run_config: RunConfig = field(init=False, repr=False)
    name_source: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.notes = rules.unsupported(self) + rules.standalone_notes(self)
        self.max_restarts, self.sources["max_restarts"] = rules.restart_budget(self)
        rules.check_program(self)
        self.min_nodes, self.max_nodes = (1, 1) if self.standalone \
            else rules.parse_nnodes(self.nnodes, self.named("nnodes"))
        self.workers_per_node = rules.local_world_size(str(self.nproc_per_node),
                                                       self.named("nproc_per_node"))
        self.view = rules.console_view(vars(self), {f: self.named(f) for f in (
            "redirects", "tee", "local_ranks_filter")}, self.role, self.workers_per_node)
        self.process = ProcessOptions(
            role=self.role, event_log_handler=self.event_log_handler,
            numa_binding=self.numa_binding, virtual_local_rank=self.virtual_local_rank,
            signals_to_handle=rules.signal_names(self.signals_to_handle,
                                                 self.named("signals_to_handle")),
            # numactl wraps the worker's own command; torchrun's --run-path with spawn
            # asks for a fresh interpreter per worker
            zygote=not self.numa_binding and not (self.run_path and self.start_method == "spawn"))
        with self._sources_named():
            self.rendezvous = self._rendezvous()
            self._configs()

    def source(self, name: str) -> str:
        """Where a setting came from: a flag, a variable, ``"default"``."""
        return self.sources.get(name, "default")

    def named(self, name: str) -> str:
        """How an error names a setting: its variable if it came from one, else its flag."""
        source = self.source(name)
        return f"--{name.replace('_', '-')}" if source in ("default", "") else source

    def _from_platform(self, name: str) -> bool:
        source = self.source(name)
        return not (source.startswith("--") or source in ("default", f"PET_{name.upper()}"))

    @contextlib.contextmanager
    def _sources_named(self) -> Iterator[None]:
        """Prefixes a ConfigError about a config field with where its value came from."""
        try:
            yield
        except ConfigError as exc:
            grace = {"FailureConfig.preemption_grace_s": self._grace()[1]}
            flags = {f: self.named(s) for f, s in {**rules.FIELD_SETTINGS, **grace}.items()}
            if exc.field not in flags:
                raise
            said = rules.in_flag_terms(str(exc), flags, exc.field)
            if flags[exc.field] not in said:  # a message that does not name its field
                said = f"{flags[exc.field]}: {said}"
            raise ConfigError(said, field=exc.field) from None

    def _grace(self) -> tuple[float, str]:
        """The workers' grace on SIGTERM: --preemption-grace, else torchrun's
        --shutdown-timeout (the same thing to torch), else ours; and its setting's name."""
        if self.preemption_grace is not None:
            return self.preemption_grace, "preemption_grace"
        if self.shutdown_timeout is not None:
            return float(self.shutdown_timeout), "shutdown_timeout"
        return DEFAULT_GRACE_S, "preemption_grace"

    def _rendezvous(self) -> RendezvousConfig:
        """torchrun's rendezvous rules as a :class:`RendezvousConfig`."""
        conf_source = self.named("rdzv_conf")
        conf = parse_rdzv_conf(self.rdzv_conf, conf_source)
        if self.standalone:
            return RendezvousConfig.single_node("standalone", conf, conf_source)
        backend = lookup(self.rdzv_backend, self.named("rdzv_backend"))
        if not backend.elastic and self.max_nodes == 1 and not self.rdzv_endpoint \
                and self.master_port is None:  # torchrun: a local c10d store
            return RendezvousConfig.single_node("launch", conf, conf_source)
        conf = backend.check_conf(conf, conf_source)
        if backend.elastic:
            # The platform's endpoint is a node's store; etcd needs one given.
            given = "" if self._from_platform("rdzv_endpoint") \
                and not backend.endpoint_is_node_store else self.rdzv_endpoint
            alone = self._meeting == 1 and backend.endpoint_is_node_store
            endpoint = given or (LOCAL_ENDPOINT if alone else "")
            self._check_elastic_job(backend, endpoint)
            source = self.named("rdzv_endpoint")
        else:
            rules.check_static_job(self)
            endpoint = self.rdzv_endpoint or f"{self.master_addr}:{self.master_port or 29500}"
            conf.setdefault("rank", self.node_rank)
            source = self.named("rdzv_endpoint") if self.rdzv_endpoint \
                else f"{self.named('master_addr')}/{self.named('master_port')}"
        run_id = self.rdzv_id if self.rdzv_id != "none" or self._meeting > 1 \
            else f"single-{uuid.uuid4().hex[:12]}"
        try:
            return RendezvousConfig(backend=backend.name, endpoint=endpoint, run_id=run_id,
                                    conf=conf)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None

    @property
    def _meeting(self) -> int:
        """How many nodes may meet at the rendezvous: the job's, and its spares."""
        return self.max_nodes + max(self.spares, 0)

    def _check_elastic_job(self, backend: Backend, endpoint: str) -> None:
        """A job across nodes needs an endpoint and an id; a backend whose state lives in a
        server of its own (etcd) needs the server's endpoint on one node too."""
        if self._meeting == 1 and backend.endpoint_is_node_store:
            return
        if not endpoint:
            spares = f" and {self.named('spares')}={self.spares}" if self.spares > 0 else ""
            why, example = (f"with {self.named('nnodes')}={self.nnodes}{spares}", "host0:29400") \
                if self._meeting > 1 else ("(its server's HOST:PORT; on one node, omit "
                                           "--rdzv-backend: no server is needed)",
                                           "etcd-host:2379")
            raise ConfigError(f"--rdzv-endpoint is required for --rdzv-backend {backend.name} "
                              f"{why}, e.g. --rdzv-endpoint {example}.")
        if self._meeting == 1:
            return
        if self.rdzv_id == "none":
            raise ConfigError(
                "--rdzv-id is required with more than one node: every node of one job "
                "must pass the same unique id (torchrun's default, the literal 'none', "
                "would join unrelated jobs), e.g. --rdzv-id job-$(date +%s); inside Slurm "
                "or a Kubeflow PyTorchJob the job's id is used.")

    def _name(self) -> tuple[str, str]:
        """The run's name and where it came from."""
        if self.name:
            return self.name, self.source("name")
        if self.rdzv_id != "none" and (self._meeting > 1 or self._from_platform("rdzv_id")):
            return self.rdzv_id, f"rdzv_id ({self.source('rdzv_id')})"
        if self.max_nodes > 1:  # a static job given no id: every node knows its master
            name = rules.endpoint_name(self.rendezvous.endpoint)
            self.notes.append(f"the run is named {name} after the master's address (every "
                              "node knows it); pass --name or --rdzv-id to choose a name.")
            return name, "the master's address"
        return f"launch_{time.strftime('%Y-%m-%d_%H-%M-%S')}", "default (a timestamp)"

    def _configs(self) -> None:
        """The Python API's configs from the settings: scaling, checkpoints, run."""
        workers = (self.min_nodes * self.workers_per_node,
                   self.max_nodes * self.workers_per_node)
        self.scaling = ScalingConfig(
            num_workers=workers if self.min_nodes < self.max_nodes else workers[0],
            num_workers_per_node=self.workers_per_node, rendezvous=self.rendezvous,
            spare_nodes=self.spares)
        self.checkpoint = CheckpointConfig(
            num_to_keep=self.num_to_keep,
            checkpoint_score_attribute=self.checkpoint_score_attribute,
            checkpoint_score_order=self.checkpoint_score_order,
            peer_replicas=self.peer_replicas)
        name, self.name_source = self._name()
        self.run_config = RunConfig(
            name=name, storage_path=self.storage_path,
            storage_options=options_from_flags(self.storage_option),
            checkpoint_config=self.checkpoint, start_over=self.start_over,
            verbose=rules.verbosity(self),
            metrics_config=MetricsConfig(port=self.metrics_port, address=self.metrics_address,
                                         otlp_endpoint=self.otlp_endpoint,
                                         otlp_interval_s=self.otlp_interval),
            straggler_config=StragglerConfig(score_threshold=self.straggler_threshold,
                                             window=self.straggler_window,
                                             min_excess_s=self.straggler_min_excess,
                                             replace=self.replace_stragglers,
                                             cool_off_s=self.straggler_cool_off),
            failure_config=FailureConfig(
                max_failures=self.max_restarts, hang_timeout_s=self.hang_timeout,
                max_preemption_failures=self.max_preemption_failures,
                preemption_grace_s=self._grace()[0],
                restart_in_process=not self.no_restart_in_process,
                unwind_timeout_s=self.unwind_timeout,
                max_restarts_without_progress=self.max_restarts_without_progress))
        check_together(self.run_config, self.scaling)  # as the launch will: --dry-run too

    @property
    def mode(self) -> str:
        """What the workers run: ``"script"``, ``"module"`` (-m) or ``"program"``
        (--no-python); torchrun's --run-path runs a script whatever else is given."""
        if self.run_path:
            return "script"
        return "program" if self.no_python else ("module" if self.module else "script")

    def flags(self) -> dict[str, object]:
        """The settings as given, JSON-ready (recorded in ``run.json``); the node and
        worker counts as resolved (``auto``, ``1``), as a resume compares them; secrets
        redacted (the program and its arguments are the user's, recorded as given)."""
        recorded = {f.name: getattr(self, f.name) for f in fields(self)
                    if f.init and f.name not in _NOT_RECORDED}
        nodes = f"{self.min_nodes}:{self.max_nodes}" if self.min_nodes < self.max_nodes \
            else str(self.min_nodes)
        recorded = {**recorded, "nnodes": nodes, "nproc_per_node": self.workers_per_node}
        return {name: value if name in ("target", "target_args") else _redacted(value)
                for name, value in recorded.items()}

    def worker_command(self) -> tuple[str, tuple[str, ...]]:
        """The agent's entrypoint and arguments for one worker. The interpreter is
        ``PYTHON_EXEC``'s, as torchrun's (then workers start without the zygote, which
        runs this interpreter), else this one."""
        if self.mode == "program":
            return self.target, tuple(self.target_args)
        target = ("-m", self.target) if self.mode == "module" else (self.target,)
        python = os.environ.get("PYTHON_EXEC", sys.executable)
        return python, ("-m", SCRIPT_WORKER, *target, *self.target_args)

    def identity(self) -> list[str]:
        """What must not change when a run is resumed: the program and its arguments."""
        prefix = {"program": ["--no-python"], "module": ["-m"], "script": []}[self.mode]
        return [*prefix, self.target, *self.target_args]


def _redacted(value: object) -> object:
    """A recorded setting with its secrets redacted: ``k=v,...`` strings (``rdzv_conf``),
    lists of them (``storage_option``), option dicts."""
    if isinstance(value, str):
        return redact_conf(value)
    if isinstance(value, list):
        return [_redacted(v) for v in value]
    if isinstance(value, dict):
        return redacted_options(value)
    return value

