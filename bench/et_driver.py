"""Driver script for variants (c) and (e): the workload through ``TorchTrainer(...).fit()``
of elastic-train, or of Ray Train with ``BENCH_TRAIN_API=ray`` (:mod:`bench.train_api`).

Usage (what the harness runs, from the repository root)::

    python -m bench.et_driver '<WorkloadConfig JSON>' NUM_WORKERS STORAGE_DIR MAX_FAILURES

The train function uses :class:`bench.et_hooks.ReportHooks` (report + checkpoint
every epoch, optionally metrics every step, resume from ``get_checkpoint()``)
and ``prepare_model`` for DDP. Threads per worker come from
``ScalingConfig(resources_per_worker={"CPU": threads})``, matching the
``torch.set_num_threads`` of the torchrun worker.
"""

from __future__ import annotations

import sys
from typing import Any

from bench import workload
from bench.et_hooks import ReportHooks
from bench.events import EventLog, restart_count, write_pid_file
from bench.train_api import train, train_torch
from bench.workload import WorkloadConfig, attempt_started, build_model, use_device


def train_func(config: dict[str, Any]) -> float:
    cfg = WorkloadConfig.from_json(config["workload"])
    rank = train.get_context().get_world_rank()
    restart = restart_count(cfg.events_dir, rank)
    write_pid_file(cfg.events_dir, rank, restart)
    log = EventLog(cfg.events_dir, rank, restart)
    log.process_started()
    log.emit("train_start")
    use_device(cfg)
    attempt_started(cfg, log)
    model = train_torch.prepare_model(build_model(cfg))
    return workload.train(cfg, model, rank, ReportHooks(cfg, rank, log), log)


def _restart_mode(cfg: WorkloadConfig) -> dict[str, Any]:
    """elastic-train's restart switch (variant c-proc turns in-process restarts off);
    Ray Train has no such setting."""
    return {} if cfg.restart_in_process else {"restart_in_process": False}


def main(argv: list[str]) -> None:
    config_json, workers, storage, max_failures = argv
    cfg = WorkloadConfig.from_json(config_json)
    train_torch.TorchTrainer(
        train_func,
        train_loop_config={"workload": config_json},
        scaling_config=train.ScalingConfig(num_workers=int(workers),
                                           use_gpu=cfg.device == "cuda",
                                           resources_per_worker={"CPU": cfg.threads}),
        run_config=train.RunConfig(
            name="bench", storage_path=storage,
            failure_config=train.FailureConfig(max_failures=int(max_failures),
                                               **_restart_mode(cfg))),
    ).fit()


if __name__ == "__main__":
    main(sys.argv[1:])
