"""A deterministic job that keeps its state live (``elastic_train.torch.LiveState``) and
counts every sample it trains on, for the live-recovery end-to-end tests.

It reports no checkpoint unless asked (``checkpoint_every_epoch``): a run with faults that
still ends bit-identical to an uninterrupted one got its state from memory, since there
was nothing in storage to restore from.
"""

from __future__ import annotations

import os
import signal

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

import elastic_train as et
from elastic_train.torch import (
    LiveState,
    enable_reproducibility,
    prepare_data_loader,
    prepare_model,
)
from tests.support import jobs

ROWS = 96


class FaultyCounter:
    """A ``Stateful`` of the job's own (steps it saw) that can fail inside
    ``LiveState.step_done`` (its ``state_dict``, copied there) or inside the state's
    transfer (its ``load_state_dict``), once each, on a given rank, as
    ``config['stateful_faults']`` says: ``{"where": "state_dict"|"load", "rank": R,
    "after": S, "how": "raise"|"sigkill", "marker": path}`` (``after``: at the
    state_dict call when it has seen S steps; a load fails at the first load after a
    recovery, whatever its step)."""

    def __init__(self, faults: list[dict]):
        self.seen = 0
        self._faults = faults

    def _fail(self, where: str) -> None:
        rank = et.get_context().get_world_rank()
        for fault in self._faults:
            if fault["where"] != where or fault["rank"] != rank or os.path.exists(fault["marker"]):
                continue
            if where == "state_dict" and fault["after"] != self.seen:
                continue
            open(fault["marker"], "w").close()
            if fault["how"] == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"injected failure in {where} at step {self.seen}")

    def state_dict(self) -> dict:
        self._fail("state_dict")
        return {"seen": self.seen}

    def load_state_dict(self, state: dict) -> None:
        self._fail("load")
        self.seen = int(state["seen"])


def dataset() -> TensorDataset:
    base = jobs.make_dataset(ROWS)
    x, y = base.tensors
    return TensorDataset(x, y, torch.arange(ROWS))


def train_live(config: dict) -> dict:
    """An MLP on a prepared loader (2 x 8 samples a step on 2 ranks), its state live.

    Returns rank 0's final weights digest, each sample's visits per epoch, the step each
    attempt started at, and the steps the counter saw."""
    enable_reproducibility(0)
    model = prepare_model(torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = prepare_data_loader(DataLoader(dataset(), batch_size=8, shuffle=True))
    epochs = config.get("epochs", 3)
    counter = FaultyCounter(config.get("stateful_faults", []))
    live = LiveState(model=model, optimizer=optimizer, counter=counter, epoch=0,
                     visits=torch.zeros(epochs, ROWS, dtype=torch.int64))
    start = live.restore()
    if et.get_context().get_world_rank() == 0 and config.get("starts_file"):
        with open(config["starts_file"], "a") as f:
            f.write(f"{start}\n")
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for epoch in range(live["epoch"], epochs):
        live["epoch"] = epoch
        for x, y, index in loader:
            jobs._inject(config, epoch, loader.position.batch - 1)
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            seen = torch.zeros(ROWS, dtype=torch.int64, device=index.device)
            seen[index] += 1
            if dist.is_initialized():  # before the step: no collective inside it
                dist.all_reduce(seen)  # every rank's samples: the count is replicated
            optimizer.step()
            live["visits"][epoch] += seen.cpu()
            counter.seen += 1
            live.step_done()
        live["epoch"] = epoch + 1  # what a checkpoint after the epoch resumes at
        if config.get("checkpoint_every_epoch"):
            with live.checkpoint() as checkpoint:  # committed before report() returns
                et.report({"epoch": epoch, "loss": loss.item()}, checkpoint=checkpoint,
                          checkpoint_upload_mode=et.CheckpointUploadMode.SYNC)
        else:
            et.report({"epoch": epoch, "loss": loss.item()})
    return {"digest": jobs.weights_digest(getattr(model, "module", model)),
            "visits": live["visits"].tolist(), "steps": live.steps, "seen": counter.seen}
