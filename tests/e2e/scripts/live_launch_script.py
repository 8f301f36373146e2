"""A ``launch`` script that keeps its state live (``elastic_train.torch.LiveState``) with a
constant global batch, for the node-loss and node-join tests of live recovery.

    live_launch_script.py OUT_DIR [--epochs E] [--sleep S]

It reports no checkpoint: whatever survives a node lost or a node joining came from a
process's memory. Rank 0 appends each attempt's (start step, world size) to OUT/starts and
each completed step to OUT/steps; at the end it saves the final weights and each
sample's visits per epoch to OUT/final.pt.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

import elastic_train as et
from elastic_train.torch import LiveState, prepare_data_loader, prepare_model

ROWS, GLOBAL_BATCH = 120, 12  # 10 steps an epoch, split over 2 or 3 ranks


def _dataset() -> TensorDataset:
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(ROWS, 8, generator=gen)
    return TensorDataset(x, (x.sum(dim=1, keepdim=True) > 0).float(), torch.arange(ROWS))


@et.restart_in_process
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--sleep", type=float, default=0.0)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = prepare_model(torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = prepare_data_loader(DataLoader(_dataset(), batch_size=2, shuffle=True),
                                 global_batch_size=GLOBAL_BATCH)
    live = LiveState(model=model, optimizer=optimizer, epoch=0,
                     visits=torch.zeros(args.epochs, ROWS, dtype=torch.int64))
    start = live.restore()
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        with open(os.path.join(args.out, "starts"), "a") as f:
            f.write(f"{start} {world}\n")
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for epoch in range(live["epoch"], args.epochs):
        live["epoch"] = epoch
        seen = torch.zeros(ROWS, dtype=torch.int64)
        taken = loader.position.taken
        for x, y, index in loader:
            with loader.accumulate(model):
                (loss_fn(model(x), y) * loader.loss_scale).backward()
            real, taken = loader.position.taken - taken, loader.position.taken
            seen[index[:real]] += 1  # the batch's own samples; the rest is padding
            if not loader.sync_gradients:
                continue
            dist.all_reduce(seen)  # before the step: no collective inside it
            optimizer.step()
            optimizer.zero_grad()
            live["visits"][epoch] += seen
            seen.zero_()
            live.step_done()
            if rank == 0:
                with open(os.path.join(args.out, "steps"), "a") as f:
                    f.write(f"{live.steps} {world}\n")
            time.sleep(args.sleep)
        live["epoch"] = epoch + 1
        et.report({"epoch": epoch, "world_size": world})
    if rank == 0:
        torch.save({"model": model.module.state_dict(), "visits": live["visits"]},
                   os.path.join(args.out, "final.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
