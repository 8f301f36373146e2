"""The GPU path (nccl, use_gpu, fractional GPUs). Skipped where no CUDA device is visible."""

from __future__ import annotations

import pytest
import torch

import elastic_train as et
from elastic_train import devices
from elastic_train.torch import TorchTrainer, get_device, prepare_model

pytestmark = [
    pytest.mark.e2e, pytest.mark.timeout(240),
    pytest.mark.skipif(not devices.count("cuda"), reason="no CUDA device"),
    pytest.mark.usefixtures("no_leaked_processes"),
]


def _train_on_gpu(config):
    import torch.distributed as dist

    device = get_device()
    model = prepare_model(torch.nn.Linear(4, 1))
    x = torch.randn(8, 4, device=device)
    model(x).sum().backward()
    et.report({"device": str(device), "backend": dist.get_backend(),
               "param_device": str(next(model.parameters()).device)})
    return str(device)


@pytest.mark.parametrize("gpu_share", [1, 0.5])
def test_gpu_workers(storage_path, gpu_share):
    workers = 2 if gpu_share < 1 else 1
    result = TorchTrainer(
        _train_on_gpu,
        scaling_config=et.ScalingConfig(num_workers=workers, use_gpu=True,
                                        resources_per_worker={"GPU": gpu_share}),
        run_config=et.RunConfig(storage_path=storage_path, name=f"gpu-{gpu_share}"),
    ).fit()
    assert result.metrics["backend"] == ("nccl" if gpu_share >= 1 else "gloo")
    assert result.metrics["device"] == "cuda:0" == result.metrics["param_device"]
