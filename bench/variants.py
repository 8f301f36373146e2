"""The variants under test and the exact command line that runs each one.

(a) bare torchrun, no checkpoints -- the floor ((a') the same with a
    per-restart store prefix, for figure 4);
(b) torchrun with a hand-written ``torch.save`` per epoch;
(c) elastic-train's Python API, ``TorchTrainer(...).fit()``;
(d) ``elastic-train launch``, only when the installed CLI has that command;
(e) Ray Train 2.60's ``TorchTrainer(...).fit()``: the (c) driver with only its
    imports switched (:mod:`bench.train_api`), only when ``ray`` is installed
    (``pip install "ray[train]==2.60.0"``; CI does not).

Every variant runs the same :mod:`bench.workload` with one torch thread per
worker (``OMP_NUM_THREADS`` and ``torch.set_num_threads`` for torchrun,
``resources_per_worker={"CPU": threads}`` for elastic-train).
"""

from __future__ import annotations

import enum
import functools
import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass

from bench.procs import free_port
from bench.train_api import API_ENV
from bench.workload import WorkloadConfig
from tests.support.paths import REPO

WORKER_SCRIPT = os.path.join(REPO, "bench", "torchrun_worker.py")
_CONSOLE_SCRIPT = os.path.join(os.path.dirname(sys.executable), "elastic-train")
# The installed console script; where the project is only on PYTHONPATH (not installed, as
# on a GPU machine with a system-wide torch), the same CLI as a module.
ELASTIC_TRAIN_CLI = [_CONSOLE_SCRIPT] if os.path.exists(_CONSOLE_SCRIPT) \
    else [sys.executable, "-m", "elastic_train.cli"]


class Harness(str, enum.Enum):
    """What starts the workers."""

    TORCHRUN = "torchrun"
    ET_API = "elastic-train API"
    ET_LAUNCH = "elastic-train launch"
    RAY = "Ray Train"


@dataclass(frozen=True)
class Variant:
    """One column of the comparison: a harness plus the workload switches it uses."""

    key: str
    label: str
    harness: Harness
    checkpoint: bool
    report_every: str = "epoch"
    namespaced_store: bool = False
    upload_mode: str | None = None  # None: the harness's default
    in_process: bool = False  # (d'): the script's main wrapped by restart_in_process
    restart_in_process: bool = True  # (c-proc): FailureConfig(restart_in_process=False)
    env: tuple[tuple[str, str], ...] = ()  # added to the run's environment
    metrics: bool = False  # (d-m): launch --metrics-port on a free port of 127.0.0.1

    def workload(self, base: WorkloadConfig) -> WorkloadConfig:
        cfg = base.replace(checkpoint=self.checkpoint, report_every=self.report_every,
                           report_api=self.harness is not Harness.TORCHRUN,
                           namespaced_store=self.namespaced_store, in_process=self.in_process,
                           restart_in_process=self.restart_in_process)
        return cfg.replace(upload_mode=self.upload_mode) if self.upload_mode else cfg


FLOOR = Variant("a", "(a) torchrun, no checkpoint", Harness.TORCHRUN, checkpoint=False)
# Figure 4 only: bare torchrun's gloo restarts fail, this is what they cost when they work.
FLOOR_NS = Variant("a-ns", "(a') torchrun, no checkpoint, store prefix per restart",
                   Harness.TORCHRUN, checkpoint=False, namespaced_store=True)
TORCH_SAVE = Variant("b", "(b) torchrun + torch.save/epoch", Harness.TORCHRUN, checkpoint=True)
ET_EPOCH = Variant("c", "(c) elastic-train API, report+ckpt/epoch", Harness.ET_API,
                   checkpoint=True)
ET_STEP = Variant("c-step", "(c) elastic-train API, +metrics report/step", Harness.ET_API,
                  checkpoint=True, report_every="step")
ET_LAUNCH = Variant("d", "(d) elastic-train launch, report+ckpt/epoch", Harness.ET_LAUNCH,
                    checkpoint=True)
# Figure 12 only: the Prometheus endpoint on (elastic_train.driver.node_metrics).
ET_LAUNCH_METRICS = Variant("d-m", "(d-m) elastic-train launch --metrics-port, report+ckpt/epoch",
                            Harness.ET_LAUNCH, checkpoint=True, metrics=True)
# The recovery figure only: the same restarts with new (warm) processes, and a launched
# script whose main is wrapped by @elastic_train.restart_in_process.
ET_PROC = Variant("c-proc", "(c) elastic-train API, restart_in_process=False", Harness.ET_API,
                  checkpoint=True, restart_in_process=False)
# The zygote's standby turned off (elastic_train.agent.zygote.standby): what it saves.
ET_NO_STANDBY = Variant("c-nostandby", "(c) elastic-train API, ELASTIC_TRAIN_STANDBY=0",
                        Harness.ET_API, checkpoint=True, env=(("ELASTIC_TRAIN_STANDBY", "0"),))
ET_LAUNCH_INPROC = Variant("d-inproc", "(d') elastic-train launch, @restart_in_process main",
                           Harness.ET_LAUNCH, checkpoint=True, in_process=True)
# Ray's default upload mode: its ASYNC needs the checkpoint directory to outlive report()
# (Ray deletes it after the upload), which the shared hooks' TemporaryDirectory does not.
RAY = Variant("e", "(e) Ray Train 2.60, report+ckpt/epoch (SYNC)", Harness.RAY,
              checkpoint=True, upload_mode="SYNC")
MAIN = (FLOOR, TORCH_SAVE, ET_EPOCH, ET_STEP, ET_LAUNCH, RAY)  # figures 1, 2 and 5


@functools.lru_cache(maxsize=1)
def launch_help() -> str | None:
    """The help text of ``elastic-train launch``, or None if the command does not exist."""
    try:
        proc = subprocess.run([*ELASTIC_TRAIN_CLI, "launch", "--help"], capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def ray_available() -> bool:
    """Whether Ray Train can be imported here (it is not a dependency of the project)."""
    return importlib.util.find_spec("ray") is not None


def base_env(threads: int, variant: Variant | None = None) -> dict[str, str]:
    """The environment of a variant: the repo importable, N torch threads; for (e)
    Ray's train API, without usage reporting."""
    env = dict(os.environ)
    if variant is not None and variant.harness is Harness.RAY:
        env.update({API_ENV: "ray", "RAY_DISABLE_USAGE_STATS": "1"})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    env["OMP_NUM_THREADS"] = str(threads)
    env.pop("ELASTIC_TRAIN_AGENT_LOGS", None)
    env.update(dict(variant.env) if variant is not None else {})
    return env


def command(variant: Variant, cfg: WorkloadConfig, workers: int, storage_dir: str,
            max_restarts: int) -> list[str]:
    """The command line of one run; ``cfg`` already names its events/checkpoint dirs."""
    py = sys.executable
    if variant.harness is Harness.TORCHRUN:
        return [py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                str(workers), "--max-restarts", str(max_restarts), WORKER_SCRIPT, cfg.to_json()]
    if variant.harness in (Harness.ET_API, Harness.RAY):
        return [py, "-m", "bench.et_driver", cfg.to_json(), str(workers), storage_dir,
                str(max_restarts)]
    metrics = ["--metrics-port", str(free_port()), "--metrics-address", "127.0.0.1"] \
        if variant.metrics else []
    return [*ELASTIC_TRAIN_CLI, "launch", "--standalone", "--nproc-per-node", str(workers),
            "--max-restarts", str(max_restarts), "--storage-path", storage_dir,
            "--name", "bench", *metrics, WORKER_SCRIPT, cfg.to_json()]
