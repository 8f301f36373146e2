"""``elastic-train launch``: torchrun's command line, with checkpoints, run records and resume.

One launcher process runs on each node. It validates its settings, records
the run in ``run.json`` (on the node that is group rank 0 after rendezvous),
and runs this node's agent; the workers run the user's script unchanged, with
torchrun's environment. Scripts that call ``elastic_train.report`` /
``get_checkpoint`` get checkpoints, retention and resume.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field

from elastic_train.agent import AgentSpec, Interrupted
from elastic_train.checkpoint import CACHE_ENV
from elastic_train.config import CheckpointConfig
from elastic_train.errors import (
    ConfigError,
    PreemptionError,
    RendezvousLostError,
    TrainingFailedError,
)
from elastic_train.rendezvous_config import (
    BACKEND_ALIASES,
    ETCD_BACKENDS,
    fast_defaults,
    parse_rdzv_conf,
)
from elastic_train.run_record import RunRecord
from elastic_train.script_worker import LAUNCH_ENV
from elastic_train.storage import RunStorage
from elastic_train.supervisor import RunSupervisor

logger = logging.getLogger(__name__)


def parse_nnodes(value: str) -> tuple[int, int]:
    """``"2"`` -> (2, 2); ``"1:4"`` -> (1, 4)."""
    try:
        low, _, high = value.partition(":")
        bounds = (int(low), int(high or low))
    except ValueError:
        bounds = (0, 0)
    if not 1 <= bounds[0] <= bounds[1]:
        raise ConfigError(f"--nnodes={value!r} is invalid: use N or MIN:MAX with "
                          "1 <= MIN <= MAX, e.g. --nnodes 2 or --nnodes 1:4.")
    return bounds


def _check_endpoint(endpoint: str) -> None:
    """``HOST:PORT`` with a port in 0..65535 (torch would fail later with a traceback).

    An empty endpoint, a bare host and IPv6 forms are left to torch's parser."""
    if endpoint.count(":") != 1:
        return
    host, port = endpoint.split(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"--rdzv-endpoint={endpoint!r} is invalid: use HOST:PORT with a "
                          "port from 0 to 65535, e.g. --rdzv-endpoint node0:29400.")


@dataclass
class LaunchSettings:
    """Everything ``elastic-train launch`` was told (torchrun's flags plus ours)."""

    target: str
    target_args: list[str] = field(default_factory=list)
    module: bool = False
    no_python: bool = False
    nnodes: str = "1"
    nproc_per_node: int = 1
    rdzv_backend: str = "c10d"
    rdzv_endpoint: str = ""
    rdzv_id: str | None = None
    rdzv_conf: str = ""
    standalone: bool = False
    max_restarts: int = 0
    monitor_interval: float = 0.1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    local_addr: str | None = None
    log_dir: str | None = None
    local_ranks_filter: set[int] | None = None
    console_streams: frozenset[str] = frozenset({"stdout", "stderr"})
    verbose: int = 1
    hang_timeout_s: float | None = None
    preemption_grace_s: float = 25.0
    max_preemption_failures: int = -1
    storage_path: str = os.path.join("~", "elastic_train_results")
    name: str | None = None
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    start_over: bool = False

    def __post_init__(self) -> None:
        self.min_nodes, self.max_nodes = parse_nnodes(self.nnodes)
        if self.nproc_per_node < 1:
            raise ConfigError(f"--nproc-per-node={self.nproc_per_node} is invalid: use >= 1.")
        if self.max_restarts < -1:
            raise ConfigError(f"--max-restarts={self.max_restarts} is invalid: use >= 0, "
                              "or -1 for unlimited.")
        if not (self.module or self.no_python) and not os.path.isfile(self.target):
            raise ConfigError(f"The training script {self.target!r} does not exist. Pass a "
                              "script path, or -m MODULE, or --no-python PROGRAM.")
        self.rdzv_backend = BACKEND_ALIASES.get(self.rdzv_backend, self.rdzv_backend)
        if self.rdzv_backend not in ("c10d", "static", *ETCD_BACKENDS):
            raise ConfigError(f"--rdzv-backend={self.rdzv_backend!r} is not supported: use "
                              "c10d (default), static, etcd or etcd-v3.")
        self.rdzv_configs = parse_rdzv_conf(self.rdzv_conf)
        if self.standalone:
            self.rdzv_backend, self.rdzv_endpoint = "c10d", "127.0.0.1:0"
            self.min_nodes = self.max_nodes = 1
        if self.max_nodes == 1 and not self.rdzv_endpoint:
            self.rdzv_endpoint = "127.0.0.1:0"
        if self.rdzv_id is None:
            if self.max_nodes > 1:
                raise ConfigError(
                    "--rdzv-id is required with more than one node: every node of one job "
                    "must pass the same unique id (torchrun's default, the literal 'none', "
                    "would join unrelated jobs), e.g. --rdzv-id job-$(date +%s).")
            self.rdzv_id = f"single-{uuid.uuid4().hex[:12]}"
        if self.rdzv_backend != "static" and not self.rdzv_endpoint:
            raise ConfigError(f"--rdzv-endpoint is required for --rdzv-backend "
                              f"{self.rdzv_backend} with --nnodes {self.nnodes}, "
                              "e.g. --rdzv-endpoint host0:29400.")
        _check_endpoint(self.rdzv_endpoint)
        if self.rdzv_backend == "static":
            self.rdzv_endpoint = f"{self.master_addr}:{self.master_port}"
            self.rdzv_configs.setdefault("rank", self.node_rank)
        else:
            for key, value in fast_defaults(self.rdzv_backend).items():
                self.rdzv_configs.setdefault(key, value)
        self.name = self.name or (self.rdzv_id if self.max_nodes > 1 else
                                  f"launch_{time.strftime('%Y-%m-%d_%H-%M-%S')}")

    def worker_command(self) -> tuple[str, tuple[str, ...]]:
        """The agent's entrypoint and arguments for one worker."""
        if self.no_python:
            return self.target, tuple(self.target_args)
        target = ("-m", self.target) if self.module else (self.target,)
        return sys.executable, ("-m", "elastic_train.script_worker", *target,
                                *self.target_args)

    def identity(self) -> list[str]:
        """What must not change when a run is resumed: the program and its arguments."""
        prefix = ["-m"] if self.module else (["--no-python"] if self.no_python else [])
        return [*prefix, self.target, *self.target_args]


START_OVER_FLAGS = ("--start-over", "--start_over")


def continuing_command(settings: LaunchSettings, argv: list[str]) -> list[str]:
    """The command that continues this run: the same flags, with the name and storage
    made explicit and without --start-over (which applies to one launch only)."""
    own = len(argv) - len(settings.target_args)
    argv = [a for a in argv[:own] if a not in START_OVER_FLAGS] + argv[own:]
    explicit = ["--name", settings.name, "--storage-path", settings.storage_path]
    return ["elastic-train", "launch", *([] if argv[:4] == explicit else explicit), *argv]


def launch(settings: LaunchSettings, argv: list[str]) -> int:
    """Runs this node's part of the job. Returns the process exit code.

    ``argv``: the arguments after ``launch``, stored as the command that continues
    the run.
    """
    storage = RunStorage.open(settings.storage_path, settings.name)
    storage.ensure_writable()
    spec = {"command": continuing_command(settings, argv), "cwd": os.getcwd(),
            "identity": settings.identity(),
            "launch": {k: sorted(v) if isinstance(v, (set, frozenset)) else v
                       for k, v in asdict(settings).items()
                       if k not in ("checkpoint", "start_over")},
            "checkpoint_config": asdict(settings.checkpoint)}
    # Every node checks before it starts anything; the node that becomes group rank 0
    # checks again as it records the launch, and is the one that starts over.
    RunRecord.check_resumable(storage, spec, start_over=settings.start_over)
    if settings.rdzv_backend in ETCD_BACKENDS:
        from elastic_train.agent.rendezvous import register

        register()
    if settings.rdzv_backend in ("c10d", "etcd-v3"):
        # Scripts join their process group through env:// against the agent's store;
        # torch's dynamic handler shares one store across restarts, which serves stale
        # addresses to a restarted gloo group. Unshared, each incarnation gets a fresh
        # store on rank 0. (Our etcd handler's shared store is new every round.)
        os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    supervisor = RunSupervisor(
        storage, settings.name, settings.max_restarts == -1, verbose=settings.verbose,
        local_ranks=settings.local_ranks_filter, streams=settings.console_streams,
        begin_record=lambda: RunRecord.begin(storage, settings.name, spec,
                                             start_over=settings.start_over))
    scratch = tempfile.mkdtemp(prefix="elastic_train_launch_")
    entrypoint, args = settings.worker_command()
    worker_env = {
        LAUNCH_ENV: json.dumps({"storage_path": settings.storage_path, "name": settings.name,
                                "checkpoint_config": asdict(settings.checkpoint),
                                "staging_dir": os.path.join(scratch, "staging")}),
        CACHE_ENV: os.path.join(scratch, "checkpoint_cache"),
    }
    if settings.nproc_per_node > 1 and "OMP_NUM_THREADS" not in os.environ:
        worker_env["OMP_NUM_THREADS"] = "1"  # as torchrun does
    agent_spec = AgentSpec(
        entrypoint=entrypoint, args=args, nproc_per_node=settings.nproc_per_node,
        run_id=settings.rdzv_id, max_restarts=2**31 - 1 if settings.max_restarts == -1
        else settings.max_restarts,
        min_nodes=settings.min_nodes, max_nodes=settings.max_nodes,
        rdzv_backend=settings.rdzv_backend, rdzv_endpoint=settings.rdzv_endpoint,
        rdzv_configs=settings.rdzv_configs, monitor_interval=settings.monitor_interval,
        log_dir=settings.log_dir or (os.path.join(storage.log_dir(), socket.gethostname())
                                     if storage.is_local else os.path.join(scratch, "logs")),
        agent_logs=settings.verbose >= 2, worker_env=worker_env, local_addr=settings.local_addr,
        hang_timeout_s=settings.hang_timeout_s,
        preemption_grace_s=settings.preemption_grace_s,
        max_preemptions=settings.max_preemption_failures,
    )
    try:
        failures = supervisor.run(agent_spec)
    except Interrupted as exc:
        print(f"elastic-train: stopped by {signal.Signals(exc.signum).name}; resume with: "
              f"{shlex.join(spec['command'])}", file=sys.stderr)
        return 128 + exc.signum
    except RendezvousLostError as exc:
        print(f"elastic-train: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if failures:
        preempted = supervisor.preempted_out
        error = (PreemptionError if preempted else TrainingFailedError).from_failures(
            failures, storage.display_path,
            settings.max_preemption_failures if preempted else settings.max_restarts,
            resume_hint=f"run the same command again: {shlex.join(spec['command'])}",
            retry_hint="pass --max-restarts N (or -1 for unlimited)")
        if supervisor.record is not None:
            supervisor.record.set_status("failed", error=str(error))
        print(f"elastic-train: {error}", file=sys.stderr)
        return 1
    if supervisor.record is not None:
        supervisor.record.set_status("finished")
    return 0
