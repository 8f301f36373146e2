"""A launch script that counts, per epoch, how often each sample is trained on.

    elastic_data_script.py OUT_DIR EPOCHS [--samples N] [--batch-size B] [--sleep S]
                           [--checkpoint-every K] [--lose-node NODE:EPOCH:STEP ...]
                           [--global-batch G] [--zip] [--fail-after-epoch E]

A ``prepare_data_loader`` loader over ``TensorDataset(arange(N))`` (shuffled); each step
all-reduces a per-sample visit counter, which every checkpoint saves (a checkpoint every
K steps inside the epoch, and one after it) and a resume restores, like weights. At
``--lose-node NODE:EPOCH:STEP`` the worker on the node whose ``ET_TEST_NODE`` is NODE
SIGKILLs its node's whole process group (agent, zygote, workers) after the step and its
checkpoint, if any: a node lost at a chosen step, once (OUT/lost-NODE-EPOCH-STEP marks
it). Rank 0 writes the counters to OUT/visits.pt at the end, and each start's (epoch,
world size) to OUT/starts.

With ``--global-batch G`` it also trains a linear regression (SGD with momentum) on
features drawn for each sample, in optimizer steps of G samples at any world size
(``prepare_data_loader(global_batch_size=G)``: micro-batches, ``loader.accumulate``,
``loader.loss_scale``); steps count optimizer steps, and rank 0 writes the final weights
to OUT/weights.pt.

With ``--zip`` the loop reads ``zip(range(len(loader)), loader)``: the loader hands out
its last batch but its iterator never runs to its end. ``--fail-after-epoch E`` makes
rank 0 raise once (OUT/failed marks it) right after epoch E's after-loop checkpoint, so
the job restarts from it.
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
from elastic_train.torch import prepare_data_loader, prepare_model


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("epochs", type=int)
    parser.add_argument("--samples", type=int, default=480)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--sleep", type=float, default=0.05)
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--lose-node", action="append", default=[])
    parser.add_argument("--global-batch", type=int, default=None)
    parser.add_argument("--zip", action="store_true")
    parser.add_argument("--fail-after-epoch", type=int, default=None)
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


def _fail_here(args: argparse.Namespace, epoch: int) -> None:
    marker = os.path.join(args.out, "failed")
    if epoch == args.fail_after_epoch and dist.get_rank() == 0 and not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError(f"injected failure after epoch {epoch}'s checkpoint")


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


def _save(state: dict, epoch: int, step: int) -> None:
    """A SYNC checkpoint of ``state`` from rank 0 (``epoch``: where a resume starts)."""
    with tempfile.TemporaryDirectory() as d:
        checkpoint = None
        if dist.get_rank() == 0:
            torch.save({**state, "epoch": epoch}, os.path.join(d, "state.pt"))
            checkpoint = et.Checkpoint.from_directory(d)
        et.report({"epoch": epoch, "step": step, "world_size": dist.get_world_size()},
                  checkpoint=checkpoint, checkpoint_upload_mode="SYNC")


class _Regression:
    """A linear model on features drawn per sample, trained in optimizer steps."""

    def __init__(self, samples: int):
        gen = torch.Generator().manual_seed(0)
        self.features = torch.randn(samples, 8, generator=gen)
        self.targets = self.features @ torch.randn(8, 1, generator=gen)
        torch.manual_seed(0)
        self.model = prepare_model(torch.nn.Linear(8, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)

    def micro_step(self, loader, x: torch.Tensor) -> None:
        with loader.accumulate(self.model):
            loss = (self.model(self.features[x]) - self.targets[x]).pow(2).mean()
            (loss * loader.loss_scale).backward()
        if loader.sync_gradients:
            self.optimizer.step()
            self.optimizer.zero_grad()

    def state(self) -> dict:
        return {"model": getattr(self.model, "module", self.model).state_dict(),
                "optimizer": self.optimizer.state_dict()}

    def load(self, state: dict) -> None:
        getattr(self.model, "module", self.model).load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


@et.restart_in_process
def main() -> None:
    args = _args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dataset = TensorDataset(torch.arange(args.samples))
    loader = prepare_data_loader(DataLoader(dataset, batch_size=args.batch_size,
                                            shuffle=True),
                                 global_batch_size=args.global_batch)
    regression = _Regression(args.samples) if args.global_batch else None
    visits = torch.zeros(args.epochs, args.samples)
    start = 0
    if (checkpoint := et.get_checkpoint()) is not None:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"), weights_only=True)
        visits, start = state["visits"], state["epoch"]
        if regression:
            regression.load(state)
    if rank == 0:
        with open(os.path.join(args.out, "starts"), "a") as f:
            f.write(f"{start} {world}\n")
    for epoch in range(start, args.epochs):
        step = 0
        # strict=False: zip stops at the range's end and never asks the loader for its end
        batches = zip(range(len(loader)), loader, strict=False) if args.zip \
            else enumerate(loader)
        for _, (x,) in batches:
            seen = torch.zeros(args.samples)
            if loader.loss_scale:  # not a batch of padding
                seen.index_add_(0, x, torch.ones(len(x)))
            dist.all_reduce(seen)
            visits[epoch] += seen
            if regression:
                regression.micro_step(loader, x)
            if not loader.sync_gradients:
                continue
            time.sleep(args.sleep)
            if (step + 1) % args.checkpoint_every == 0:  # inside the epoch: resume in it,
                finished = loader.state_dict()["finished"]  # or after it, its last batch
                _save({"visits": visits, **(regression.state() if regression else {})},
                      epoch + finished, step)
            _lose_node_here(args, epoch, step)
            step += 1
        _save({"visits": visits, **(regression.state() if regression else {})}, epoch + 1, -1)
        _fail_here(args, epoch)
    if rank == 0:
        torch.save(visits, os.path.join(args.out, "visits.pt"))
        if regression:
            torch.save(regression.state()["model"], os.path.join(args.out, "weights.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
