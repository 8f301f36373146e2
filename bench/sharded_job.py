"""The FSDP2 + DCP job of figures 10 and 11 (bench/sharded_figure.py), run by
``python -m bench.sharded_run``: an MLP of ``layers`` square layers of ``width``,
sharded with ``fully_shard``, AdamW, a DCP checkpoint of every rank's shards after
each epoch. Each rank appends what it did, with ``time.time()`` stamps, to
``<events>/rank<R>.jsonl``: ``loaded`` (and what the load read), ``first_step``,
``save`` (seconds blocked), ``kill``. With ``settle``, each save waits (untimed) until
the previous checkpoint is committed, so that the save's own cost is timed, not
the wait for a slower upload.
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


class _Saver:
    """Sync (``dcp.save``) or async (``dcp.async_save`` + ``written=``) checkpoints."""

    def __init__(self, use_async: bool):
        import torch.distributed as dist

        self.group = dist.new_group(backend="gloo") if use_async else None
        self.pending = None

    def save(self, config: dict, rank: int, state: dict, metrics: dict) -> None:
        import torch.distributed.checkpoint as dcp

        import elastic_train as et

        directory = tempfile.mkdtemp(prefix="bench_dcp_")
        began = time.perf_counter()
        if self.group is None:
            dcp.save(state, checkpoint_id=directory)
            written = None
        else:
            if self.pending is not None:
                self.pending.result()
            written = self.pending = dcp.async_save(state, checkpoint_id=directory,
                                                    process_group=self.group)
        saved = time.perf_counter()
        et.report(metrics, checkpoint=et.Checkpoint.from_directory(directory, written=written))
        reported = time.perf_counter()
        if written is None:  # report() copied the files; an async one takes them over
            shutil.rmtree(directory)
        _note(config, rank, "save", save_s=saved - began, report_s=reported - saved)


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
    saver = _Saver(config["async_save"])
    gen = torch.Generator().manual_seed(rank)
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
        for step in range(config["steps"]):
            loss = model(torch.randn(4, width, generator=gen)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step == 0 and epoch == start:
                _note(config, rank, "first_step")
        if config.get("settle") and epoch > start:  # uploads keep up: no backpressure
            _wait_for_commit(epoch)
        saver.save(config, rank, state_of(model, optimizer, epoch + 1), {"loss": loss.item()})
    return {"world_size": dist.get_world_size()}
