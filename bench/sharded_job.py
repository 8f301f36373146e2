"""The FSDP2 + DCP job of figures 10 and 11 (bench/sharded_figure.py), run by
``python -m bench.sharded_run``: an MLP of ``layers`` square layers of ``width``,
sharded with ``fully_shard``, AdamW, a DCP checkpoint of every rank's shards after
each epoch, saved one of three ways (:class:`_Saver`). Each rank appends what it did,
with ``time.time()`` stamps, to ``<events>/rank<R>.jsonl``: ``loaded`` (and what the
load read), ``first_step``, ``save`` (seconds blocked, and a bare copy of the same
tensors; ``first``: the first save of the attempt), ``steps`` (the times of
``timed_steps`` steps with nothing in flight before a save, and of those of the
``timed_steps`` after it that began while its files were still being written),
``kill``, and with ``back_to_back`` two more saves, the second at once after the first
(``back_to_back``: what it waits for). With ``settle``, each save waits (untimed) until
the previous checkpoint is committed, so that the save's own cost is timed, not the
wait for a slower upload.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time

MIB = 1 << 20


def width_for(total_mb: float, layers: int) -> int:
    """The layer width whose model + AdamW state (3 floats per parameter) is ``total_mb``."""
    return max(8, int((total_mb * MIB / 12 / layers) ** 0.5))


def _note(config: dict, rank: int, event: str, **fields) -> None:
    with open(os.path.join(config["events"], f"rank{rank}.jsonl"), "a") as f:
        f.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")


def _model(config: dict):
    import torch
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    width = width_for(config["size_mb"], config["layers"])
    layers = [torch.nn.Linear(width, width) for _ in range(config["layers"])]
    model = torch.nn.Sequential(*layers)
    for layer in layers:
        fully_shard(layer)
    return fully_shard(model), width


def _load(config: dict, checkpoint, model, optimizer, rank: int) -> int:
    from tests.support.fsdp_jobs import load_sharded

    epoch, read = load_sharded(checkpoint, model, optimizer, config["loader"])
    _note(config, rank, "loaded", epoch=epoch, **read)
    return epoch


def _local_tensors(obj) -> list:
    """The tensors in a nested state, a DTensor as this rank's shard."""
    from torch.distributed.tensor import DTensor

    if isinstance(obj, dict):
        return [t for value in obj.values() for t in _local_tensors(value)]
    if isinstance(obj, (list, tuple)):
        return [t for value in obj for t in _local_tensors(value)]
    if isinstance(obj, DTensor):
        return [obj.to_local()]
    return [obj] if hasattr(obj, "untyped_storage") else []


class _Saver:
    """One of three ways to checkpoint: ``sync`` (``dcp.save``), ``thread``
    (``dcp.async_save``, a thread, + ``written=``) or ``process``
    (``elastic_train.torch.async_save``, a writer process). Each save also times a bare
    copy of the same tensors into host buffers allocated at the first save: the floor
    of what any save blocks for, measured in the same run."""

    def __init__(self, how: str):
        import torch.distributed as dist

        self.how = how
        self.group = dist.new_group(backend="gloo") if how == "thread" else None
        self.pending = None
        self.buffers: list = []
        self.saves = 0  # the first of an attempt also starts the writers, imports, ...

    def bare_copy_s(self, state: dict) -> float:
        import torch

        tensors = _local_tensors(state)
        if not self.buffers:
            self.buffers = [torch.empty_like(t, device="cpu") for t in tensors]
        began = time.perf_counter()
        for buffer, tensor in zip(self.buffers, tensors, strict=True):
            buffer.copy_(tensor)
        return time.perf_counter() - began

    def save(self, config: dict, rank: int, state: dict, metrics: dict, event: str = "save"):
        """Saves and reports ``state``; notes the seconds blocked; returns the future of
        the files (None once written)."""
        import torch.distributed.checkpoint as dcp

        import elastic_train as et
        from elastic_train.torch import async_save

        copy_s = self.bare_copy_s(state)
        began = time.perf_counter()
        if self.how == "process":
            checkpoint = async_save(state)
        else:
            directory = tempfile.mkdtemp(prefix="bench_dcp_")
            written = None
            if self.how == "sync":
                dcp.save(state, checkpoint_id=directory)
            else:
                if self.pending is not None:
                    self.pending.result()
                written = self.pending = dcp.async_save(state, checkpoint_id=directory,
                                                        process_group=self.group)
            checkpoint = et.Checkpoint.from_directory(directory, written=written)
        saved = time.perf_counter()
        et.report(metrics, checkpoint=checkpoint)
        reported = time.perf_counter()
        if checkpoint.written is None:  # report() copied the files; an async one takes them
            shutil.rmtree(checkpoint.path)
        _note(config, rank, event, save_s=saved - began, report_s=reported - saved,
              copy_s=copy_s, first=self.saves == 0)
        self.saves += 1
        return checkpoint.written


def _wait_for_commit(epoch: int) -> None:
    """Until the checkpoint of ``epoch`` (index epoch - 1) is committed: a kill then
    always restarts from it, whatever the upload speed."""
    import elastic_train as et

    storage = et.get_context().get_storage()
    fs, run = storage.storage_filesystem, storage.experiment_fs_path
    marker = f"{run}/checkpoint_{epoch - 1:06d}/.commit.json"
    while not (fs.invalidate_cache() or fs.exists(marker)):
        time.sleep(0.05)


def train(config: dict) -> dict:
    import torch
    import torch.distributed as dist

    import elastic_train as et
    from tests.support.fsdp_jobs import state_of

    rank = dist.get_rank()
    _note(config, rank, "started")  # the session is up: restart point chosen and checked
    model, width = _model(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    start = 0
    if (checkpoint := et.get_checkpoint()) is not None:
        start = _load(config, checkpoint, model, optimizer, rank)
    saver = _Saver(config["saver"])
    gen = torch.Generator().manual_seed(rank)

    def step() -> float:
        began = time.perf_counter()
        loss = model(torch.randn(4, width, generator=gen)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return time.perf_counter() - began

    for epoch in range(start, config["epochs"]):
        if epoch == config.get("kill_epoch") and rank == config["kill_rank"] \
                and not os.path.exists(config["kill_marker"]):
            _wait_for_commit(epoch)
            open(config["kill_marker"], "w").close()
            _note(config, rank, "kill")
            os.kill(os.getpid(), signal.SIGKILL)
        if epoch == config.get("fail_epoch"):
            _wait_for_commit(epoch)
            raise RuntimeError("the end of the first launch (bench: nodes replaced next)")
        for n in range(config["steps"]):
            step()
            if n == 0 and epoch == start:
                _note(config, rank, "first_step")
        if config.get("settle") and epoch > start:  # uploads keep up: no backpressure
            _wait_for_commit(epoch)
        quiet = [step() for _ in range(config.get("timed_steps", 0))]  # nothing in flight
        first = saver.saves == 0
        written = saver.save(config, rank, state_of(model, optimizer, epoch + 1),
                             {"epoch": epoch})
        writing = []  # steps begun while this rank's files were being written
        for _ in range(config.get("timed_steps", 0)):  # as many on every rank (FSDP)
            in_flight = written is not None and not written.done()
            took = step()
            if in_flight:
                writing.append(took)
        _note(config, rank, "steps", quiet=quiet, writing=writing, first=first)
    if config.get("back_to_back"):  # the second waits for the first's write, if it must
        _wait_for_commit(config["epochs"])  # and the first for nothing
        for event in ("save", "back_to_back"):
            saver.save(config, rank, state_of(model, optimizer, config["epochs"]),
                       {"epoch": config["epochs"]}, event=event)
    return {"world_size": dist.get_world_size()}
