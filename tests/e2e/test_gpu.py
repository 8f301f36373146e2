"""The GPU path: nccl, use_gpu, fractional GPUs, in-process restarts on a GPU (a raise and a
SIGKILL: bit-identical weights, a restarted rank whose CUDA works, a survivor that freed
the failed attempt's memory), live recovery on nccl (a raise: every step kept, no
checkpoint), ``launch --nproc-per-node gpu`` on nccl, and the FSDP example on nccl.
Skipped where no CUDA device is visible: devices are counted in a
forked child (:func:`elastic_train._internal.devices.count`), never by ``torch.cuda`` in pytest's
process, whose forks would be poisoned."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import cloudpickle
import pytest
import torch

import elastic_train as et
from elastic_train._internal import devices
from elastic_train.torch import TorchTrainer, get_device, prepare_model
from tests.conftest import EPOCHS
from tests.support import gpu_jobs, jobs, live_jobs
from tests.support.examples import FSDP_QUICK, run_fsdp_example
from tests.support.launched import run_state
from tests.support.paths import REPO

cloudpickle.register_pickle_by_value(gpu_jobs)
cloudpickle.register_pickle_by_value(live_jobs)

GPUS = devices.count("cuda")
WORKERS = min(GPUS, 2)  # one GPU each
BALLAST_MB = 256  # held on the device by every attempt (tests/support/gpu_jobs.py)

pytestmark = [
    pytest.mark.e2e, pytest.mark.timeout(240),
    pytest.mark.skipif(not GPUS, reason="no CUDA device"),
    pytest.mark.usefixtures("no_leaked_processes"),
]

CLI = [sys.executable, "-m", "elastic_train.cli"]
LAUNCH_SCRIPT = os.path.join(REPO, "tests/e2e/scripts/gpu_launch_script.py")


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


def fit_on_gpu(storage_path, name, probe_file, faults=()):
    """The deterministic MLP job on ``WORKERS`` GPUs (nccl), one restart allowed."""
    return TorchTrainer(
        gpu_jobs.train_mlp_on_gpu,
        train_loop_config={"epochs": EPOCHS, "faults": list(faults), "probe_file": probe_file,
                           "ballast_mb": BALLAST_MB},
        scaling_config=et.ScalingConfig(num_workers=WORKERS, use_gpu=True),
        run_config=et.RunConfig(storage_path=storage_path, name=name,
                                failure_config=et.FailureConfig(max_failures=1)),
        datasets={"train": jobs.make_dataset()},
    ).fit()


@pytest.fixture(scope="module")
def gpu_baseline(tmp_path_factory):
    """A fault-free run of the job on the GPU(s): the reference for bit-identical resumes."""
    root = tmp_path_factory.mktemp("gpu-baseline")
    return fit_on_gpu(str(root / "results"), "baseline", str(root / "probe"))


@pytest.mark.parametrize("how", ["raise", "sigkill"])
def test_restart_on_gpu_resumes_bit_identical(storage_path, tmp_path, gpu_baseline, how):
    rank = WORKERS - 1  # with one GPU, the only rank
    probe_file = str(tmp_path / "probe")
    result = fit_on_gpu(storage_path, how, probe_file,
                        [{"rank": rank, "epoch": 2, "batch": 1, "how": how,
                          "marker": str(tmp_path / "marker")}])
    assert result.return_value["digest"] == gpu_baseline.return_value["digest"]
    assert result.metrics["epoch"] == EPOCHS - 1
    [failure] = run_state(storage_path, how)["failures"]
    assert failure["restart"] == "in-process", failure

    probes = gpu_jobs.read_probes(probe_file)
    assert sorted((p["rank"], p["attempt"]) for p in probes) == \
        sorted((r, a) for r in range(WORKERS) for a in (0, 1)), probes
    for p in probes:  # every attempt's process, the restarted rank's included, has its GPU
        assert p["works"] and not p["bad_fork"] and p["device"].startswith("cuda"), p
    failed = {p["attempt"]: p for p in probes if p["rank"] == rank}
    if how == "raise":  # the same process again, the failed attempt's tensors freed
        assert failed[0]["pid"] == failed[1]["pid"], probes
    else:  # a new process, forked from the warm zygote: its CUDA must start
        assert failed[0]["pid"] != failed[1]["pid"], probes
    for p in probes:  # survivors (and the raising rank) hold none of the ballast
        assert not p["previous_ballast_alive"], probes
        if p["attempt"] == 1:
            assert p["allocated_mb"] < BALLAST_MB / 2, probes


@pytest.mark.parametrize("crash", [False, True], ids=["straight", "crash-in-process"])
def test_launch_nproc_gpu_runs_an_nccl_script(storage_path, tmp_path, crash):
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run(
        [*CLI, "launch", "--standalone", "--nproc-per-node", "gpu", "--max-restarts", "1",
         "--storage-path", storage_path, "--name", "nccl", LAUNCH_SCRIPT, str(out), "cuda",
         *(["--crash"] if crash else [])],
        cwd=REPO, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = {}
    for path in out.iterdir():
        _, rank, _, attempt, _, pid = path.name.split("-")
        records[int(rank), int(attempt)] = (int(pid), path.read_text().split(" ", 2))
    attempts = (0, 1) if crash else (0,)
    assert sorted(records) == [(r, a) for r in range(GPUS) for a in attempts], records
    for _, (total, backend, name) in records.values():
        assert float(total) == GPUS * (GPUS + 1) / 2 and backend == "nccl" and name, records
    if crash:  # every rank restarted in its own process
        assert all(records[r, 0][0] == records[r, 1][0] for r in range(GPUS)), records
        [failure] = run_state(storage_path, "nccl")["failures"]
        assert failure["restart"] == "in-process", failure


def test_fsdp_example_on_nccl(tmp_path):
    """examples/fsdp_transformer.py with --use-gpu: FSDP2 on nccl, resumed from its sharded
    checkpoint; with 2 GPUs its rank 1 is SIGKILLed and resumed as on CPU
    (tests/e2e/test_fsdp_example.py), with one it runs alone."""
    if WORKERS == 2:
        out = run_fsdp_example(tmp_path, "--use-gpu", *FSDP_QUICK)
        assert "rank 1: killing myself at step 15" in out
        resumed = re.findall(r"rank (\d): resumed at step (\d+)", out)
        assert sorted(resumed) == [("0", "10"), ("0", "20"), ("1", "10")], out
    else:
        out = run_fsdp_example(tmp_path, "--use-gpu", "--num-workers", "1", "--kill-at-step", "0",
                          "--steps", "20", "--checkpoint-every", "10", "--more-steps", "10")
        assert re.search(r"rank 0: resumed at step 20", out), out
    assert re.search(r"run 2: .* on 1 worker\(s\), resharded from " + str(WORKERS), out), out


def _fit_live_on_gpu(storage_path, name, tmp_path, faults=()):
    return TorchTrainer(
        live_jobs.train_live,
        train_loop_config={"epochs": 2, "faults": list(faults),
                           "starts_file": str(tmp_path / f"starts-{name}")},
        scaling_config=et.ScalingConfig(num_workers=WORKERS, use_gpu=True),
        run_config=et.RunConfig(storage_path=storage_path, name=name,
                                failure_config=et.FailureConfig(max_failures=1)),
    ).fit()


def test_live_recovery_on_nccl_keeps_every_step(storage_path, tmp_path):
    """The live state on the GPU: the survivors' state moves to host memory when the
    attempt fails and comes back on the device; bit-identical to the uninterrupted run,
    each sample once, no checkpoint written."""
    reference = _fit_live_on_gpu(storage_path, "live-reference", tmp_path).return_value
    rank = WORKERS - 1
    fault = {"rank": rank, "epoch": 1, "batch": 2, "how": "raise",
             "marker": str(tmp_path / "live-marker")}
    result = _fit_live_on_gpu(storage_path, "live-raise", tmp_path, [fault])
    assert result.metrics is not None and result.return_value["digest"] == reference["digest"]
    assert result.return_value["visits"] == reference["visits"]
    steps_per_epoch = live_jobs.ROWS // (8 * WORKERS)
    assert (tmp_path / "starts-live-raise").read_text().split() == \
        ["0", str(steps_per_epoch + 2)]
    assert result.goodput.live_recoveries == 1
