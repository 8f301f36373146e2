"""One node's driver of a multi-node ``fit()`` whose train function counts, per epoch,
how often each row of its dataset shard is trained on.

Usage: python -m tests.e2e.scripts.elastic_data_driver STORAGE NAME OUT_DIR ENDPOINT EPOCHS

Each node runs one worker of a job of 1 to 2 nodes (etcd at ENDPOINT). The train
function reads ``get_dataset_shard("train").iter_torch_batches(batch_size=8)`` of 480
rows, all-reduces a per-row visit counter each step and checkpoints it every 5 steps
and after each epoch. The worker on the node whose ``ET_TEST_NODE`` is 1 SIGKILLs its
driver (the node is lost) after step 12 of epoch 1, once. Rank 0 writes the counters to
OUT_DIR/visits.pt at the end, and each start's world size to OUT_DIR/worlds.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset

import elastic_train as et
from elastic_train.torch import TorchTrainer

ROWS = 480
DRIVER_PID = "ELASTIC_DATA_DRIVER_PID"  # set by the driver, inherited by its workers


def _save(visits: torch.Tensor, epoch: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        checkpoint = None
        if dist.get_rank() == 0:
            torch.save({"visits": visits, "epoch": epoch}, os.path.join(d, "state.pt"))
            checkpoint = et.Checkpoint.from_directory(d)
        et.report({"epoch": epoch}, checkpoint=checkpoint, checkpoint_upload_mode="SYNC")


def _lose_this_node(out_dir: str, epoch: int, step: int) -> None:
    marker = os.path.join(out_dir, "lost")
    if (os.environ.get("ET_TEST_NODE") == "1" and (epoch, step) == (1, 12)
            and not os.path.exists(marker)):
        open(marker, "w").close()
        os.kill(int(os.environ[DRIVER_PID]), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


def train(config: dict) -> None:
    out_dir, epochs = config["out_dir"], config["epochs"]
    rank, world = dist.get_rank(), dist.get_world_size()
    shard = et.get_dataset_shard("train")
    visits, start = torch.zeros(epochs, ROWS), 0
    if (checkpoint := et.get_checkpoint()) is not None:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"), weights_only=True)
        visits, start = state["visits"], state["epoch"]
    if rank == 0:
        with open(os.path.join(out_dir, "worlds"), "a") as f:
            f.write(f"{world}\n")
    for epoch in range(start, epochs):
        for step, (x,) in enumerate(shard.iter_torch_batches(batch_size=8)):
            seen = torch.zeros(ROWS)
            seen.index_add_(0, x, torch.ones(len(x)))
            dist.all_reduce(seen)
            visits[epoch] += seen
            time.sleep(0.05)
            if (step + 1) % 5 == 0:
                _save(visits, epoch)
            _lose_this_node(out_dir, epoch, step)
        _save(visits, epoch + 1)
    if rank == 0:
        torch.save(visits, os.path.join(out_dir, "visits.pt"))


if __name__ == "__main__":
    storage, name, out_dir, endpoint, epochs = sys.argv[1:6]
    os.environ[DRIVER_PID] = str(os.getpid())
    TorchTrainer(
        train,
        train_loop_config={"out_dir": out_dir, "epochs": int(epochs)},
        scaling_config=et.ScalingConfig(
            num_workers=(1, 2), num_workers_per_node=1,
            rendezvous=et.RendezvousConfig(backend="etcd", endpoint=endpoint, run_id=name)),
        run_config=et.RunConfig(storage_path=storage, name=name,
                                failure_config=et.FailureConfig(max_failures=2)),
        datasets={"train": TensorDataset(torch.arange(ROWS))},
    ).fit()
