"""``TorchConfig``: how each worker joins the torch.distributed process group.

The workers do not use ``init_process_group("env://")`` against the agent's
store directly. That store outlives worker restarts, and a restarted gloo
group reads the addresses the previous incarnation left under the same keys
(``Gloo connectFullMesh failed ... Connection refused``). Instead every
incarnation of the group gets a generation id agreed by the agents at
rendezvous, and the workers namespace the store with it, so no key from an
earlier attempt is ever read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from elastic_train._internal import devices
from elastic_train.config import ScalingConfig
from elastic_train.context import WorkerEnv
from elastic_train.errors import ConfigError
from elastic_train.worker.backend import BackendConfig, WorkerResources

BACKENDS = ("gloo", "nccl")
INIT_METHODS = ("env", "tcp")


def worker_devices(local_rank: int, gpus_per_worker: float) -> list[torch.device]:
    """The devices of a worker: CPU, a share of one GPU, or several whole GPUs."""
    if gpus_per_worker == 0:
        return [torch.device("cpu")]
    if gpus_per_worker < 1:
        return [torch.device("cuda", int(local_rank * gpus_per_worker + 1e-6))]
    count = int(gpus_per_worker)
    return [torch.device("cuda", local_rank * count + i) for i in range(count)]


@dataclass
class TorchConfig(BackendConfig):
    """Mirrors ``ray.train.torch.TorchConfig``.

    Args:
        backend: ``"gloo"`` or ``"nccl"``; default nccl with whole GPUs, else
            gloo (also for fractional GPUs, which NCCL cannot share).
        init_method: ``"env"`` or ``"tcp"``, accepted for compatibility. Both
            reach the rendezvous store the elastic agent gives the workers.
        timeout_s: Timeout of collectives and of joining the group, seconds.
    """

    backend: str | None = None
    init_method: str = "env"
    timeout_s: int = 1800

    def backend_for(self, scaling: ScalingConfig) -> str:
        """nccl with whole GPUs per worker, else gloo: NCCL refuses two ranks on one device,
        so fractional GPUs use gloo (Ray's own example pairs GPU 0.5 with gloo)."""
        if self.backend:
            return self.backend
        return "nccl" if scaling.use_gpu and scaling.gpus_per_worker >= 1 else "gloo"

    def validate(self, scaling: ScalingConfig) -> None:
        backend = self.backend_for(scaling)
        if backend not in BACKENDS:
            raise ConfigError(f"TorchConfig.backend={self.backend!r} is not supported: "
                              f"use one of {BACKENDS} or None.", field="TorchConfig.backend")
        if self.init_method not in INIT_METHODS:
            raise ConfigError(f"TorchConfig.init_method={self.init_method!r} is invalid: "
                              f"use one of {INIT_METHODS}.", field="TorchConfig.init_method")
        if not (isinstance(self.timeout_s, (int, float)) and self.timeout_s > 0):
            raise ConfigError(f"TorchConfig.timeout_s={self.timeout_s!r} must be a number > 0.",
                              field="TorchConfig.timeout_s")
        if backend == "nccl" and not scaling.use_gpu:
            raise ConfigError("TorchConfig.backend='nccl' needs GPUs: set "
                              "ScalingConfig(use_gpu=True) or use backend='gloo'.",
                              field="TorchConfig.backend")
        if backend == "nccl" and 0 < scaling.gpus_per_worker < 1:
            raise ConfigError(
                f"TorchConfig.backend='nccl' cannot share a GPU between workers "
                f"(resources_per_worker['GPU']={scaling.gpus_per_worker}): NCCL refuses two "
                "ranks on one device. Use backend='gloo' (or None), or whole GPUs.",
                field="TorchConfig.backend")
        if scaling.use_gpu:
            have = devices.count("cuda")  # counted in a child: the driver forks workers
            need = scaling.gpus_needed()
            if have < need:
                raise ConfigError(
                    f"ScalingConfig(use_gpu=True, num_workers={scaling.num_workers}) needs {need} "
                    f"GPU(s) on this node but {have} are visible: set use_gpu=False, lower "
                    "num_workers, or share devices with resources_per_worker={'GPU': 0.5}."
                )

    def on_worker_start(self, env: WorkerEnv, scaling: ScalingConfig) -> WorkerResources:
        torch.set_num_threads(scaling.threads_per_worker(env.local_world_size))
        devices = worker_devices(env.local_rank, scaling.gpus_per_worker)
        if devices[0].type == "cuda":
            torch.cuda.set_device(devices[0])
        timeout = timedelta(seconds=self.timeout_s)
        base = dist.TCPStore(
            env.master_addr, env.master_port, world_size=env.world_size,
            is_master=not env.use_agent_store and env.rank == 0,
            timeout=timeout, multi_tenant=True,
        )
        store = dist.PrefixStore(f"elastic_train/{env.generation}/", base)
        backend = self.backend_for(scaling)
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        dist.init_process_group(backend, store=store, rank=env.rank,
                                world_size=env.world_size, timeout=timeout)
        control = dist.group.WORLD if backend == "gloo" else dist.new_group(backend="gloo")
        return WorkerResources(devices=devices, control_group=control)

    def on_worker_shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
