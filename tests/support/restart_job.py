"""A deterministic job that fails on a schedule, for in-process restart tests and the soak.

:func:`train_with_faults` trains a small MLP from a DataLoader with worker
processes (``num_workers``), checkpoints every ``checkpoint_every`` batches and
resumes exactly (model, optimizer and the prepared loader's position). Each
attempt first appends what the process holds to ``probe_file`` (rank 0, the
survivor: rank 0 never fails), then fails ``faults[attempt]`` on rank 1 after
``fail_after`` batches, if the schedule has a fault for it:

- ``raise``: an exception in the train function;
- ``exit`` / ``sigkill``: the process ends (``os._exit(1)`` / ``SIGKILL``).

Attempts are told apart by ``TORCHELASTIC_RESTART_COUNT``, which goes up with
every restart (in process or not). The conftest pickles this module by value.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile

import torch
from torch.utils.data import DataLoader, TensorDataset

import elastic_train as et
from elastic_train.torch import enable_reproducibility, prepare_data_loader, prepare_model


def process_probe() -> dict:
    """What this process holds now: open fds, threads, child processes, resident memory."""
    children = 0
    me = str(os.getpid())
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    children += f.read().rsplit(")", 1)[1].split()[1] == me
            except OSError:
                continue
    with open("/proc/self/status") as f:
        rss_kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
    return {"pid": os.getpid(), "fds": len(fds), "fd_targets": fds,
            "threads": len(os.listdir("/proc/self/task")), "children": children,
            "rss_kb": rss_kb}


def dataset(rows: int = 256, features: int = 8) -> TensorDataset:
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(rows, features, generator=gen)
    return TensorDataset(x, (x.sum(dim=1, keepdim=True) > 0).float())


def _fail(how: str) -> None:
    if how == "raise":
        raise RuntimeError("injected failure")
    if how == "exit":
        os._exit(1)
    os.kill(os.getpid(), signal.SIGKILL)


def train_with_faults(config: dict) -> dict:
    enable_reproducibility(0)
    rank = et.get_context().get_world_rank()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if rank == 0 and config.get("probe_file"):
        with open(config["probe_file"], "a") as f:
            f.write(json.dumps({"attempt": attempt, **process_probe()}) + "\n")
    model = prepare_model(torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(),
                                              torch.nn.Linear(32, 1)))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = prepare_data_loader(DataLoader(dataset(), batch_size=8, shuffle=True,
                                            num_workers=config.get("num_workers", 2)))
    start = 0
    if (checkpoint := et.get_checkpoint()) is not None:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"), weights_only=True)
        getattr(model, "module", model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["epoch"]
    fault = config.get("faults", {}).get(str(attempt))
    batches = 0
    for epoch in range(start, config["epochs"]):
        for x, y in loader:
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            batches += 1
            if fault and rank == 1 and batches == config.get("fail_after", 1):
                _fail(fault)
            if batches % config.get("checkpoint_every", 4) == 0:  # after the last batch:
                finished = loader.state_dict()["finished"]  # the epoch is done
                _report(model, optimizer, epoch + finished, loss.item())
        _report(model, optimizer, epoch + 1, loss.item())
    unwrapped = getattr(model, "module", model)
    return {"weights": {k: v.clone() for k, v in unwrapped.state_dict().items()}}


def _report(model, optimizer, epoch: int, loss: float) -> None:
    """A checkpoint from rank 0; ``epoch`` is where a resume starts (the loader keeps its
    position inside the epoch)."""
    with tempfile.TemporaryDirectory() as d:
        checkpoint = None
        if et.get_context().get_world_rank() == 0:
            torch.save({"model": getattr(model, "module", model).state_dict(),
                        "optimizer": optimizer.state_dict(), "epoch": epoch},
                       os.path.join(d, "state.pt"))
            checkpoint = et.Checkpoint.from_directory(d)
        # SYNC: a checkpoint reported before a fault is committed, so every attempt that
        # reports one makes progress (the no-progress guard counts commits, not reports).
        et.report({"loss": loss, "epoch": epoch}, checkpoint=checkpoint,
                  checkpoint_upload_mode="SYNC")
