"""``elastic-train launch``: torchrun's command line, with checkpoints, run records and resume.

One launcher process runs on each node. Its flags become the configuration
objects of the Python API (:class:`~elastic_train.ScalingConfig`,
:class:`~elastic_train.RunConfig`, :class:`~elastic_train.FailureConfig`,
:class:`~elastic_train.CheckpointConfig`,
:class:`~elastic_train.RendezvousConfig`), so every rule is checked once and a
bad flag gets the same error as the setting it maps to, with the flag named.
The node's run is then :mod:`.node_run`'s, as for ``fit()``; the workers run
the user's script unchanged, with torchrun's environment. Scripts that call
``elastic_train.report`` / ``get_checkpoint`` get checkpoints, retention and
resume.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields

from elastic_train import env_vars
from elastic_train.agent.api import Interrupted
from elastic_train.agent.rendezvous.backends import lookup
from elastic_train.agent.rendezvous.config import RendezvousConfig, parse_rdzv_conf
from elastic_train.config import (
    DEFAULT_STORAGE_PATH,
    CheckpointConfig,
    FailureConfig,
    RunConfig,
    ScalingConfig,
)
from elastic_train.driver.node_run import FailureHints, NodePlan, NodeRun
from elastic_train.errors import ConfigError, TrainingFailedError, exit_code
from elastic_train.redaction import redact_argv, redact_conf, redacted_options
from elastic_train.storage import RunStorage

SCRIPT_WORKER = "elastic_train.worker.script_worker"

# The config field each flag sets: a ConfigError about the field names the flag too.
_FIELD_FLAGS = {
    "ScalingConfig.num_workers_per_node": "--nproc-per-node",
    "FailureConfig.max_failures": "--max-restarts",
    "FailureConfig.hang_timeout_s": "--hang-timeout",
    "FailureConfig.preemption_grace_s": "--preemption-grace",
    "FailureConfig.max_preemption_failures": "--max-preemption-failures",
    "FailureConfig.unwind_timeout_s": "--unwind-timeout",
    "FailureConfig.max_restarts_without_progress": "--max-restarts-without-progress",
    "CheckpointConfig.num_to_keep": "--num-to-keep",
    "CheckpointConfig.checkpoint_score_attribute": "--checkpoint-score-attribute",
    "RunConfig.name": "--name",
    "RunConfig.storage_path": "--storage-path",
    "RendezvousConfig.backend": "--rdzv-backend",
    "CheckpointConfig.checkpoint_score_order": "--checkpoint-score-order",
}
# Flags not recorded in run.json's "launch": the checkpoint settings are recorded as
# "checkpoint_config"; --start-over applies to one launch only.
_NOT_RECORDED = ("num_to_keep", "checkpoint_score_attribute", "checkpoint_score_order",
                 "start_over")


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


@contextlib.contextmanager
def _flags_named(more: dict[str, str] | None = None) -> Iterator[None]:
    """Prefixes a ConfigError about a config field with the flag that set it (``more``:
    fields whose flag depends on the settings)."""
    try:
        yield
    except ConfigError as exc:
        text = str(exc)
        for name, flag in {**_FIELD_FLAGS, **(more or {})}.items():
            if text.startswith(name + "=") or text.startswith(name + " "):
                raise ConfigError(f"{flag}: {text}") from None
        raise


@dataclass
class LaunchSettings:
    """Everything ``elastic-train launch`` was told (torchrun's flags plus ours).

    ``__post_init__`` checks what only the command line has (``--nnodes``
    syntax, the script, a multi-node job's ``--rdzv-id``) and turns the rest
    into the Python API's configs: :attr:`scaling`, :attr:`rendezvous` and
    :attr:`run_config`.
    """

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
    restart_in_process: bool = True
    unwind_timeout_s: float = 10.0
    max_restarts_without_progress: int = 3
    storage_path: str = DEFAULT_STORAGE_PATH
    storage_options: dict[str, str] | None = None
    name: str | None = None
    num_to_keep: int | None = None
    checkpoint_score_attribute: str | None = None
    checkpoint_score_order: str = "max"
    start_over: bool = False

    def __post_init__(self) -> None:
        if not (self.module or self.no_python) and not os.path.isfile(self.target):
            raise ConfigError(f"The training script {self.target!r} does not exist. Pass a "
                              "script path, or -m MODULE, or --no-python PROGRAM.")
        if self.nproc_per_node < 1:
            raise ConfigError(f"--nproc-per-node={self.nproc_per_node} is invalid: use >= 1.")
        min_nodes, max_nodes = (1, 1) if self.standalone else parse_nnodes(self.nnodes)
        if max_nodes > 1 and not self.rdzv_id:
            raise ConfigError(
                "--rdzv-id is required with more than one node: every node of one job "
                "must pass the same unique id (torchrun's default, the literal 'none', "
                "would join unrelated jobs), e.g. --rdzv-id job-$(date +%s).")
        with _flags_named():
            self.rendezvous = self._rendezvous(max_nodes)
            workers = (min_nodes * self.nproc_per_node, max_nodes * self.nproc_per_node)
            self.scaling = ScalingConfig(
                num_workers=workers if min_nodes < max_nodes else workers[0],
                num_workers_per_node=self.nproc_per_node, rendezvous=self.rendezvous)
            self.checkpoint = CheckpointConfig(
                num_to_keep=self.num_to_keep,
                checkpoint_score_attribute=self.checkpoint_score_attribute,
                checkpoint_score_order=self.checkpoint_score_order)
            self.run_config = RunConfig(
                name=self.name or (self.rdzv_id if max_nodes > 1 else
                                   f"launch_{time.strftime('%Y-%m-%d_%H-%M-%S')}"),
                storage_path=self.storage_path, storage_options=self.storage_options,
                checkpoint_config=self.checkpoint,
                verbose=self.verbose, start_over=self.start_over,
                failure_config=FailureConfig(
                    max_failures=self.max_restarts, hang_timeout_s=self.hang_timeout_s,
                    max_preemption_failures=self.max_preemption_failures,
                    preemption_grace_s=self.preemption_grace_s,
                    restart_in_process=self.restart_in_process,
                    unwind_timeout_s=self.unwind_timeout_s,
                    max_restarts_without_progress=self.max_restarts_without_progress))

    def _rendezvous(self, max_nodes: int) -> RendezvousConfig:
        """torchrun's rendezvous flags as a :class:`RendezvousConfig`."""
        if self.standalone:
            return RendezvousConfig.single_node("standalone")
        backend = lookup(self.rdzv_backend, "--rdzv-backend")
        conf = parse_rdzv_conf(self.rdzv_conf, "--rdzv-conf")
        endpoint = self.rdzv_endpoint or ("127.0.0.1:0" if max_nodes == 1 else "")
        if not backend.elastic:
            endpoint = f"{self.master_addr}:{self.master_port}"
            conf.setdefault("rank", self.node_rank)
        elif max_nodes > 1 and not endpoint:
            raise ConfigError(f"--rdzv-endpoint is required for --rdzv-backend "
                              f"{self.rdzv_backend} with --nnodes {self.nnodes}, "
                              "e.g. --rdzv-endpoint host0:29400.")
        flag = "--rdzv-endpoint" if backend.elastic else "--master-addr/--master-port"
        with _flags_named({"RendezvousConfig.endpoint": flag}):
            return RendezvousConfig(backend=backend.name, endpoint=endpoint,
                                    run_id=self.rdzv_id or f"single-{uuid.uuid4().hex[:12]}",
                                    conf=conf)

    def flags(self) -> dict[str, object]:
        """The flags as given, JSON-ready, their secrets redacted (recorded in ``run.json``;
        the program and its arguments are the user's, recorded as given)."""
        flags = {f.name: sorted(v) if isinstance(v := getattr(self, f.name), (set, frozenset))
                 else v for f in fields(self) if f.name not in _NOT_RECORDED}
        return {name: v if name in ("target", "target_args") else
                redact_conf(v) if isinstance(v, str) else
                redacted_options(v) if isinstance(v, dict) else v for name, v in flags.items()}

    def worker_command(self) -> tuple[str, tuple[str, ...]]:
        """The agent's entrypoint and arguments for one worker."""
        if self.no_python:
            return self.target, tuple(self.target_args)
        target = ("-m", self.target) if self.module else (self.target,)
        return sys.executable, ("-m", SCRIPT_WORKER, *target, *self.target_args)

    def identity(self) -> list[str]:
        """What must not change when a run is resumed: the program and its arguments."""
        prefix = ["-m"] if self.module else (["--no-python"] if self.no_python else [])
        return [*prefix, self.target, *self.target_args]


START_OVER_FLAGS = ("--start-over", "--start_over")


def continuing_command(settings: LaunchSettings, argv: list[str]) -> list[str]:
    """The command that continues this run: the same flags, with the name and storage
    made explicit and without --start-over (which applies to one launch only), and their
    secrets redacted (it is stored and printed). The program's own arguments are the
    user's: they are kept as given (resuming compares them)."""
    own = len(argv) - len(settings.target_args) - 1  # where the program starts
    flags = [a for a in argv[:own] if a not in START_OVER_FLAGS]
    explicit = ["--name", settings.run_config.name, "--storage-path", settings.storage_path]
    flags = flags if flags[:4] == explicit else [*explicit, *flags]
    return ["elastic-train", "launch", *redact_argv(flags), *argv[own:]]


def launch(settings: LaunchSettings, argv: list[str]) -> int:
    """Runs this node's part of the job. Returns the process exit code.

    ``argv``: the arguments after ``launch``, stored as the command that continues
    the run.
    """
    command = continuing_command(settings, argv)
    run_config = settings.run_config
    plan = NodePlan(
        storage=RunStorage.open(settings.storage_path, run_config.name,
                                options=settings.storage_options), run_config=run_config,
        scaling=settings.scaling, rendezvous=settings.rendezvous,
        spec={"command": command, "cwd": os.getcwd(), "identity": settings.identity(),
              "launch": settings.flags(), "checkpoint_config": asdict(settings.checkpoint)},
        hints=FailureHints(resume=f"run the same command again: {shlex.join(command)}",
                           retry="pass --max-restarts N (or -1 for unlimited)"),
        local_ranks=settings.local_ranks_filter, streams=settings.console_streams,
        log_dir=settings.log_dir, monitor_interval=settings.monitor_interval,
        local_addr=settings.local_addr)
    if lookup(settings.rendezvous.backend, "--rdzv-backend").reuses_store:
        # Scripts join their process group through env://; torch's dynamic handler
        # hands every round the same store, which serves stale addresses to a
        # restarted gloo group. Unshared, each incarnation gets a fresh store on rank 0.
        os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    with NodeRun(plan) as node:
        worker_env = {env_vars.LAUNCH: json.dumps({
            "storage_path": settings.storage_path, "name": run_config.name,
            "storage_options": settings.storage_options,
            "checkpoint_config": asdict(settings.checkpoint), "staging_dir": node.staging_dir})}
        if settings.nproc_per_node > 1 and "OMP_NUM_THREADS" not in os.environ:
            worker_env["OMP_NUM_THREADS"] = "1"  # as torchrun does
        try:
            node.run(*settings.worker_command(), worker_env)
        except Interrupted as exc:
            print(f"elastic-train: stopped by {signal.Signals(exc.signum).name}; resume with: "
                  f"{shlex.join(command)}", file=sys.stderr)
            return 128 + exc.signum
        except TrainingFailedError as exc:  # the budget is spent, or the rendezvous lost
            print(f"elastic-train: {exc}", file=sys.stderr)
            return exit_code(exc)
    return 0
