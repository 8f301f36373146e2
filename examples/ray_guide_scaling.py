"""Ray Train's "Configuring Scale and GPUs" guide with the imports changed.

The guide's settings, gathered into one job as a Ray script carries them: workers and
their resources, the accelerator type, a placement strategy, the trainer's own
resources, the communication backend, ``NCCL_SOCKET_IFNAME`` in every worker's
environment, and (from "Handling Failures") ``fail_fast``. Here the scheduling hints
(``placement_strategy``, ``accelerator_type``, ``trainer_resources``) are accepted and
ignored with one warning each at ``fit()``, the environment variable is set in every
worker and ``fail_fast=True`` stops at the first failure (see docs/porting-from-ray.md).
What differs from the guide besides the imports, and why:

- ``ray.init(runtime_env=...)`` has no ``ray`` to call: the guide's variables go in
  ``RunConfig(worker_runtime_env=...)``, Ray Train v2's own place for them;
- the guide's ``train_func`` only asserts its devices; this one also trains a linear
  model for a few steps and returns what each rank saw (CPU here; ``--use-gpu``).

    python examples/ray_guide_scaling.py --storage-path /tmp/results
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

import elastic_train  # was: import ray.train
from elastic_train import FailureConfig, RunConfig, ScalingConfig  # was: from ray.train import
from elastic_train.torch import (  # was: from ray.train.torch import
    TorchConfig,
    TorchTrainer,
    get_device,
    prepare_model,
)


def train_func() -> dict:
    device = get_device()
    model = prepare_model(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.ones(8, 4, device=device), torch.zeros(8, 1, device=device)
    for step in range(3):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        elastic_train.report({"loss": loss.item(), "step": step})
    seen = [None] * dist.get_world_size()  # every rank's environment, gathered on all
    dist.all_gather_object(seen, {"device": str(device),
                                  "NCCL_SOCKET_IFNAME": os.environ.get("NCCL_SOCKET_IFNAME")})
    return {"ranks": seen}


def run_job(storage_path: str | None = None, name: str = "scaling_guide",
            use_gpu: bool = False) -> elastic_train.Result:
    trainer = TorchTrainer(
        train_func,
        scaling_config=ScalingConfig(
            num_workers=2,
            use_gpu=use_gpu,
            resources_per_worker={"CPU": 1, "GPU": 1} if use_gpu else {"CPU": 1},
            accelerator_type="A100",
            placement_strategy="SPREAD",
            trainer_resources={"CPU": 0},
        ),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(
            name=name, storage_path=storage_path, start_over=True,
            worker_runtime_env={"env_vars": {"NCCL_SOCKET_IFNAME": "lo"}},
            failure_config=FailureConfig(fail_fast=True),
        ),
    )
    return trainer.fit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage-path", default=None)
    parser.add_argument("--use-gpu", action="store_true")
    args = parser.parse_args()
    result = run_job(args.storage_path, use_gpu=args.use_gpu)
    for rank, seen in enumerate(result.return_value["ranks"]):
        print(f"rank {rank}: {seen}")


if __name__ == "__main__":
    main()
