"""A launch script that counts, per epoch, how often each sample is trained on.

    elastic_data_script.py OUT_DIR EPOCHS [--samples N] [--batch-size B] [--sleep S]
                           [--checkpoint-every K] [--lose-node NODE:EPOCH:STEP ...]

A ``prepare_data_loader`` loader over ``TensorDataset(arange(N))`` (shuffled); each step
all-reduces a per-sample visit counter, which every checkpoint saves (a checkpoint every
K steps inside the epoch, and one after it) and a resume restores, like weights. At
``--lose-node NODE:EPOCH:STEP`` the worker on the node whose ``ET_TEST_NODE`` is NODE
SIGKILLs its node's whole process group (agent, zygote, workers) after the step and its
checkpoint, if any: a node lost at a chosen step, once (OUT/lost-NODE-EPOCH-STEP marks
it). Rank 0 writes the counters to OUT/visits.pt at the end, and each start's (epoch,
world size) to OUT/starts.
"""

import argparse
import os
import signal
import tempfile
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

import elastic_train as et
from elastic_train.torch import prepare_data_loader


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("epochs", type=int)
    parser.add_argument("--samples", type=int, default=480)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--sleep", type=float, default=0.05)
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--lose-node", action="append", default=[])
    return parser.parse_args()


def _lose_node_here(args: argparse.Namespace, epoch: int, step: int) -> None:
    for spec in args.lose_node:
        node, at_epoch, at_step = spec.split(":")
        marker = os.path.join(args.out, f"lost-{node}-{at_epoch}-{at_step}")
        if (node == os.environ.get("ET_TEST_NODE") and (epoch, step) == (int(at_epoch),
                                                                         int(at_step))
                and not os.path.exists(marker)):
            open(marker, "w").close()
            os.killpg(_agent_pid(), signal.SIGKILL)  # the test starts it as a group leader
            os.kill(os.getpid(), signal.SIGKILL)


def _agent_pid() -> int:
    """This node's ``elastic-train launch`` process: the furthest ancestor that runs it."""
    pid, agent = os.getpid(), None
    while pid > 1:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"elastic_train.cli\0launch" in f.read():
                agent = pid
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    assert agent is not None, "no elastic-train launch among this worker's ancestors"
    return agent


def _save(visits: torch.Tensor, epoch: int, step: int) -> None:
    """A SYNC checkpoint of the counters from rank 0 (``epoch``: where a resume starts)."""
    with tempfile.TemporaryDirectory() as d:
        checkpoint = None
        if dist.get_rank() == 0:
            torch.save({"visits": visits, "epoch": epoch}, os.path.join(d, "state.pt"))
            checkpoint = et.Checkpoint.from_directory(d)
        et.report({"epoch": epoch, "step": step, "world_size": dist.get_world_size()},
                  checkpoint=checkpoint, checkpoint_upload_mode="SYNC")


@et.restart_in_process
def main() -> None:
    args = _args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dataset = TensorDataset(torch.arange(args.samples))
    loader = prepare_data_loader(DataLoader(dataset, batch_size=args.batch_size,
                                            shuffle=True))
    visits = torch.zeros(args.epochs, args.samples)
    start = 0
    if (checkpoint := et.get_checkpoint()) is not None:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"), weights_only=True)
        visits, start = state["visits"], state["epoch"]
    if rank == 0:
        with open(os.path.join(args.out, "starts"), "a") as f:
            f.write(f"{start} {world}\n")
    for epoch in range(start, args.epochs):
        for step, (x,) in enumerate(loader):
            seen = torch.zeros(args.samples)
            seen.index_add_(0, x, torch.ones(len(x)))
            dist.all_reduce(seen)
            visits[epoch] += seen
            time.sleep(args.sleep)
            if (step + 1) % args.checkpoint_every == 0:
                _save(visits, epoch, step)  # inside the epoch: resume in this epoch
            _lose_node_here(args, epoch, step)
        _save(visits, epoch + 1, -1)
    if rank == 0:
        torch.save(visits, os.path.join(args.out, "visits.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
