"""Worker script of the torchrun-style variants: (a), (b) and (d).

Usage (what the harness runs)::

    python -m torch.distributed.run --standalone --nproc-per-node N \\
        bench/torchrun_worker.py '<WorkloadConfig JSON>'
    elastic-train launch --standalone --nproc-per-node N ... \\
        bench/torchrun_worker.py '<WorkloadConfig JSON>'

Like any torchrun script it initialises its own process group (``env://``, or
with ``namespaced_store`` through a per-restart store prefix) and wraps the
model in DDP. The hooks come from the config: none (a), a hand-written
``torch.save`` per epoch (b), or elastic-train's ``report()`` +
``get_checkpoint()`` (d, ``report_api=true``; only then is elastic_train
imported, so the floor never pays for it).
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from bench.events import EventLog, write_pid_file
from bench.hooks import NoHooks, TorchSaveHooks
from bench.workload import (
    Hooks,
    WorkloadConfig,
    attempt_started,
    build_model,
    train,
    use_device,
)


def make_hooks(cfg: WorkloadConfig, rank: int, log: EventLog) -> Hooks:
    if not cfg.checkpoint:
        return NoHooks()
    if cfg.report_api:
        from bench.et_hooks import ReportHooks

        return ReportHooks(cfg, rank, log)
    return TorchSaveHooks(cfg.ckpt_dir, rank, log)


def init_process_group(backend: str, namespaced: bool, rank: int, restart: int) -> None:
    """``env://`` as torchrun users write it, or -- with ``namespaced`` -- the agent's
    store under a per-restart prefix.

    torch's agent keeps one store for the whole job, and a restarted gloo group
    can read the addresses the previous group left in it ("Gloo connectFullMesh
    failed ... Connection refused"); a fresh prefix per restart avoids that, as
    elastic-train's generation ids do.
    """
    if not namespaced:
        dist.init_process_group(backend)
        return
    world_size = int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          world_size=world_size, is_master=False)
    dist.init_process_group(backend, store=dist.PrefixStore(f"bench/restart{restart}/", store),
                            rank=rank, world_size=world_size)


def main(config_json: str) -> None:
    cfg = WorkloadConfig.from_json(config_json)
    rank = int(os.environ["RANK"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    write_pid_file(cfg.events_dir, rank, restart)
    log = EventLog(cfg.events_dir, rank, restart)
    log.process_started()
    log.emit("imported")
    torch.set_num_threads(cfg.threads)
    use_device(cfg)
    init_process_group("nccl" if cfg.device == "cuda" else "gloo", cfg.namespaced_store, rank,
                       restart)
    log.emit("train_start")
    attempt_started(cfg, log)
    model = build_model(cfg)
    if cfg.device == "cuda":
        model = model.to(torch.device("cuda", torch.cuda.current_device()))
    if dist.get_world_size() > 1:
        model = DistributedDataParallel(model)  # on its device: DDP takes it from the model
    train(cfg, model, rank, make_hooks(cfg, rank, log), log)
    dist.destroy_process_group()


if __name__ == "__main__":
    if WorkloadConfig.from_json(sys.argv[1]).in_process:  # (d'): restarted in process
        import elastic_train

        main = elastic_train.restart_in_process(main)
    main(sys.argv[1])
    # The run is over and its events are written. torch 2.14's gloo sometimes aborts in
    # the interpreter's finalization ("terminate called without an active exception",
    # SIGABRT: 2 of about 10 smoke runs once), which would fail a finished run; the
    # worker leaves without finalization, as elastic-train's forked workers do.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
