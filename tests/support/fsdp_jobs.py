"""A deterministic FSDP2 job with DCP sharded checkpoints, for the end-to-end tests.

Every rank saves its shards with ``torch.distributed.checkpoint`` into a directory
of its own and reports it; the committed checkpoint holds every rank's
``__<rank>_0.distcp`` and rank 0's ``.metadata``. A resume loads through
:class:`~elastic_train.torch.CheckpointReader` (``load="reader"``) or from
``as_directory()`` (``load="directory"``). Pickled by value (see tests/e2e/test_fsdp.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import fully_shard

import elastic_train as et
from elastic_train.storage.dcp_writer import writer_pid
from elastic_train.torch import CheckpointReader, async_save, enable_reproducibility
from tests.support import jobs
from tests.support.process_tree import thread_policies
from tests.support.slow_write import SlowToWrite

FEATURES = 16
_previous: list = []  # the async save still in flight, if any


def build_model(hidden: int) -> torch.nn.Module:
    """An MLP sharded with FSDP2: each layer, then the root (torchtitan's order)."""
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, 1))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    return fully_shard(model)


def batch(epoch: int, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(epoch * 1000 + step * 10 + rank)
    x = torch.randn(8, FEATURES, generator=gen)
    return x, x.sum(dim=1, keepdim=True).tanh()


def full_digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str | None:
    """SHA-256 of the whole (unsharded) model and optimizer state, on rank 0 (collective)."""
    model_state, optim_state = get_state_dict(
        model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() != 0:
        return None
    digest = hashlib.sha256(jobs.state_digest(model_state).encode())
    for fqn, state in sorted(optim_state["state"].items()):
        digest.update(fqn.encode())
        digest.update(jobs.state_digest({k: torch.as_tensor(v) for k, v in state.items()})
                      .encode())
    return digest.hexdigest()


def state_of(model, optimizer, epoch: int) -> dict:
    """Each rank's part of model and optimizer state, as DCP saves and loads it."""
    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state, "epoch": epoch}


def load_sharded(checkpoint: et.Checkpoint, model, optimizer, how: str) -> tuple[int, dict]:
    """Loads the sharded state (DCP reshards it to this world size); returns the epoch
    to start from and what the load read."""
    state = state_of(model, optimizer, 0)
    stats = {}
    if how == "reader":
        reader = CheckpointReader(checkpoint)
        dcp.load(state, storage_reader=reader)
        stats = {"fetched": reader.bytes_fetched, "local": reader.bytes_local}
    else:
        with checkpoint.as_directory() as d:
            dcp.load(state, checkpoint_id=d)
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    return state["epoch"], stats


def _save(config: dict, model, optimizer, epoch: int, loss: torch.Tensor, digest: str | None,
          group) -> None:
    state = state_of(model, optimizer, epoch)
    metrics = {"loss": loss.item(), "epoch": epoch, "digest": digest}
    if config.get("process_save"):
        _save_in_writer_process(config, state, metrics, epoch)
        return
    directory = tempfile.mkdtemp(prefix="dcp_")
    if group is not None:  # async: the writes go on after report() returns
        if _previous:  # one save at a time in the group: the last must be done
            _previous.pop().result()
        written = dcp.async_save(state, checkpoint_id=directory, process_group=group)
        et.report(metrics, checkpoint=et.Checkpoint.from_directory(directory, written=written))
        _previous.append(written)
        return
    dcp.save(state, checkpoint_id=directory)
    et.report(metrics, checkpoint=et.Checkpoint.from_directory(directory),
              checkpoint_upload_mode=config.get("upload_mode"))
    shutil.rmtree(directory)  # as a Ray script would: the default mode keeps it


def _save_in_writer_process(config: dict, state: dict, metrics: dict, epoch: int) -> None:
    """``async_save``: DCP's writer process writes the shards. Until the fault has
    struck, rank ``slow["rank"]``'s save of epoch ``slow["epoch"]`` takes
    ``slow["seconds"]`` to write (:class:`SlowToWrite`); a fault at batch ``"saved"``
    of an epoch strikes right after that epoch's report()."""
    slow = config.get("slow", {})
    if (epoch, dist.get_rank()) == (slow.get("epoch"), slow.get("rank")) \
            and not os.path.exists(config["fault"]["marker"]):
        state["slow"] = SlowToWrite(slow["seconds"])
    checkpoint = async_save(state)
    # the checkpoint before the slow one is committed before that starts: a kill during
    # the slow write resumes from it, however slowly the writer process started
    mode = "SYNC" if epoch + 1 == slow.get("epoch") else "ASYNC"
    et.report(metrics, checkpoint=checkpoint, checkpoint_upload_mode=mode)
    writer = writer_pid()
    _note(config, {"epoch": epoch, "writer": writer, "in_flight": not checkpoint.written.done(),
                   "writer_policies": None if writer is None else  # not started yet
                   sorted(thread_policies(writer))})
    jobs._inject(config, epoch, "saved")


def _note(config: dict, record: dict) -> None:
    """Appends a JSON line to ``config['notes']`` (one file per rank and attempt)."""
    if config.get("notes"):
        path = os.path.join(config["notes"], f"rank{dist.get_rank()}-{os.getpid()}.jsonl")
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


def train_fsdp(config: dict) -> dict:
    """``epochs`` epochs of ``steps`` steps, a DCP checkpoint after each; faults as in
    :func:`tests.support.jobs.train_mlp`. Returns rank 0's digest of the full final state."""
    enable_reproducibility(config.get("seed", 0))
    # Module state outlives an in-process restart: a save of the failed attempt (whose
    # group is gone, so it may have failed) is not this attempt's to wait for.
    _previous.clear()
    model = build_model(config.get("hidden", 32))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    # async_save's background collectives need a group the training does not use
    group = dist.new_group(backend="gloo") if config.get("async_save") else None
    start = 0
    checkpoint = et.get_checkpoint()
    if checkpoint:
        start, stats = load_sharded(checkpoint, model, optimizer, config.get("load", "reader"))
        _note(config, {"restored": checkpoint.path, "world_size": dist.get_world_size(),
                       "digest": full_digest(model, optimizer), "time": time.time(), **stats})
    loss = torch.zeros(())
    for epoch in range(start, config.get("epochs", 4)):
        for step in range(config.get("steps", 3)):
            jobs._inject(config, epoch, step)
            x, y = batch(epoch, step, dist.get_rank())
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        digest = full_digest(model, optimizer) if config.get("digest_every_epoch") else None
        _save(config, model, optimizer, epoch + 1, loss, digest, group)
    return {"digest": full_digest(model, optimizer), "world_size": dist.get_world_size()}
