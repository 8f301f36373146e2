"""Deterministic training jobs and fault injection for the end-to-end tests.

The conftest registers this module to be pickled by value, so workers can
run these functions without the tests directory on their path.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import signal
import tempfile
import time

import torch
from torch.utils.data import TensorDataset

import elastic_train as et
from elastic_train._internal import env_vars
from elastic_train.torch import async_save, enable_reproducibility, prepare_model


def make_dataset(rows: int = 96, features: int = 8) -> TensorDataset:
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(rows, features, generator=gen)
    y = (x.sum(dim=1, keepdim=True) > 0).float()
    return TensorDataset(x, y)


def weights_digest(model: torch.nn.Module) -> str:
    return state_digest(model.state_dict())


def state_digest(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 over every parameter's name and bytes: equal only if bit-identical."""
    digest = hashlib.sha256()
    for name, tensor in sorted(state.items()):
        data = tensor.detach().cpu().contiguous()
        digest.update(name.encode())
        if data.numel():  # the tensor's bytes, read without numpy (a GPU box may lack it)
            digest.update(ctypes.string_at(data.data_ptr(), data.numel() * data.element_size()))
    return digest.hexdigest()


def checkpoint_digest(checkpoint: et.Checkpoint) -> str:
    """The weights digest of a checkpoint saved by :func:`train_mlp` (as its return value)."""
    with checkpoint.as_directory() as d:
        state = torch.load(os.path.join(d, "state.pt"), weights_only=True)
    return state_digest(state["model"])


def _inject(config: dict, epoch: int, batch: int) -> None:
    """Fails once per fault, where and how ``config['fault']`` (or each of
    ``config['faults']``) says; a marker file makes each happen once."""
    for fault in config.get("faults", [config["fault"]] if config.get("fault") else []):
        _inject_one(fault, epoch, batch)


def _inject_one(fault: dict, epoch: int, batch: int) -> None:
    if et.get_context().get_world_rank() != fault["rank"]:
        return
    if (epoch, batch) != (fault["epoch"], fault.get("batch", 0)):
        return
    marker = fault["marker"]
    if os.path.exists(marker):
        return
    open(marker, "w").close()
    how = fault["how"]
    if how == "raise":
        raise RuntimeError(f"injected failure at epoch {epoch}")
    if how == "exit":
        os._exit(1)
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "kill_zygote":  # the process this worker was forked from
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(60)  # dies with it (PR_SET_PDEATHSIG)
    if how == "deadlock":  # never reach the collective the other ranks wait in
        time.sleep(3600)
    if how == "wedge":  # a C call that never returns and holds the GIL: no signal gets in
        mutex = ctypes.create_string_buffer(64)  # a zeroed pthread_mutex_t: unlocked
        libc = ctypes.PyDLL(None)  # PyDLL keeps the GIL during the call
        libc.pthread_mutex_lock(mutex)
        libc.pthread_mutex_lock(mutex)  # a default mutex locked twice: waits for ever
    if how == "sticky_device":  # a CUDA error that sticks to the context, as the worker's
        # check after the failure finds it (torch.cuda.synchronize() raising); then fail
        from elastic_train.worker.inprocess import loop as inprocess

        inprocess.device_healthy = lambda: False
        raise RuntimeError(f"injected CUDA error at epoch {epoch}")
    if how == "preempt":  # the scheduler's notice; the test SIGKILLs us later
        with open(fault["pid_file"], "w") as f:
            f.write(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGTERM)
        return
    if how == "wipe_tier":  # this node's disk wiped; its peers' copies kept, lost or bad
        from tests.support.peer_faults import wipe_tier

        wipe_tier(fault["peer"], fault["out_dir"], fault.get("hostile_s", 0.0))
        raise RuntimeError(f"injected failure after wiping the node's tier at epoch {epoch}")
    if how == "wait_for_kill":  # the test SIGKILLs us from outside
        with open(fault["pid_file"], "w") as f:
            f.write(str(os.getpid()))
        time.sleep(120)


def report_then_a_peer_fails(config: dict) -> None:
    """Rank 0 reports a checkpoint whose file lands ``write_s`` later (as with
    ``dcp.async_save``), so its upload is still in flight when rank 1 raises right
    after the same report."""
    from concurrent.futures import ThreadPoolExecutor

    rank = et.get_context().get_world_rank()
    checkpoint = None
    if rank == 0:
        directory = tempfile.mkdtemp()

        def write() -> None:
            time.sleep(config["write_s"])
            with open(os.path.join(directory, "state.txt"), "w") as f:
                f.write("reported before rank 1 failed")

        written = ThreadPoolExecutor(1).submit(write)
        checkpoint = et.Checkpoint.from_directory(directory, written=written)
    et.report({"step": 1}, checkpoint=checkpoint)
    if rank == 1:
        raise RuntimeError("rank 1 fails right after the report")
    time.sleep(120)  # until the agent ends the attempt


def report_then_fail_once(config: dict) -> str | None:
    """Attempt 0 does what :func:`report_then_a_peer_fails` does; the next attempt
    returns what its restored checkpoint holds (None without one)."""
    restored = et.get_checkpoint()
    if restored is None:
        report_then_a_peer_fails(config)
        return None
    with restored.as_directory() as d, open(os.path.join(d, "state.txt")) as f:
        return f.read()


def train_mlp(config: dict) -> dict:
    """A small deterministic MLP on a dataset shard, checkpointing every epoch.

    Returns rank 0's final weights digest and the epochs each attempt started at.
    """
    enable_reproducibility(config.get("seed", 0))
    ctx = et.get_context()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    model = prepare_model(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    start_epoch = 0
    # The loss each report carries: the last one computed (a resume's first report may
    # come before any batch: the loss saved with the checkpoint). A checkpoint inside the
    # epoch saves whether the shard's pass is finished (its last batch ran: a resume goes
    # on with the next epoch).
    loss = None
    checkpoint = et.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"), weights_only=True)
        getattr(model, "module", model).load_state_dict(state["model"])  # DDP or not
        optimizer.load_state_dict(state["optimizer"])
        # A mid-epoch checkpoint resumes in its epoch; the shard continues at its batch.
        start_epoch = state["epoch"] + (1 if state.get("epoch_done", True) else 0)
        loss = state.get("loss")
    if ctx.get_world_rank() == 0 and config.get("starts_file"):
        with open(config["starts_file"], "a") as f:
            f.write(f"{start_epoch}\n")
    if config.get("pids_file"):  # which process runs each rank's attempts
        with open(config["pids_file"], "a") as f:
            f.write(f"{ctx.get_world_rank()} {os.getpid()}\n")
    shard = et.get_dataset_shard("train")
    loss_fn = torch.nn.BCEWithLogitsLoss()
    saved_on_notice = False
    first_step = True
    for epoch in range(start_epoch, config.get("epochs", 5)):
        for x, y in shard.iter_torch_batches(batch_size=8):
            batch = shard.state_dict()["batch"] - 1  # index in the epoch, also after a resume
            _inject(config, epoch, batch)
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if first_step and ctx.get_world_rank() == 0 and config.get("events_file"):
                with open(config["events_file"], "a") as f:  # for recovery times
                    f.write(f"first_step {time.time()}\n")
            first_step = False
            time.sleep(config.get("step_sleep", 0))
            if config.get("mark_steps"):
                et.step()
            every = config.get("checkpoint_every_batches")
            if every and (batch + 1) % every == 0:
                _report(config, model, optimizer, epoch, loss,
                        epoch_done=shard.state_dict()["finished"])
            if config.get("watch_preemption") and not saved_on_notice \
                    and et.get_preemption_info() is not None:  # a just-in-time checkpoint
                _report(config, model, optimizer, epoch, loss,
                        epoch_done=shard.state_dict()["finished"], jit=1)
                saved_on_notice = True
                if ctx.get_world_rank() == 0 and config.get("jit_file"):
                    with open(config["jit_file"], "w") as f:
                        f.write(f"{epoch} {batch}\n")
        before = _session_checkpoint() if config.get("report_log") else None
        _report(config, model, optimizer, epoch, loss, epoch_done=True)
        if config.get("report_log"):
            _log_report(config["report_log"], epoch, before)
    # Of the unwrapped model, as checkpointed: comparable with checkpoint_digest().
    return {"digest": weights_digest(getattr(model, "module", model)),
            "world_size": ctx.get_world_size()}


def _session_checkpoint() -> str | None:
    checkpoint = et.get_checkpoint()
    return checkpoint.path if checkpoint is not None else None


def _log_report(path: str, epoch: int, before: str | None) -> None:
    """After an epoch's report, rank 0 appends ``ATTEMPT EPOCH SYNCED NOTICE``: SYNCED 1 when
    the report was committed before it returned (a SYNC upload: only then does the session's
    checkpoint become the one just reported), NOTICE 1 when the ranks agree that a
    preemption notice stands (what makes a report SYNC). Every rank must call it."""
    notice = et.get_preemption_info() is not None  # collective
    if et.get_context().get_world_rank() == 0:
        with open(path, "a") as f:
            f.write(f"{os.environ.get(env_vars.ATTEMPT, '0')} {epoch} "
                    f"{int(_session_checkpoint() != before)} {int(notice)}\n")


def _report(config: dict, model, optimizer, epoch: int, loss, epoch_done: bool,
            jit: int = 0) -> None:
    """Reports metrics with a checkpoint from rank 0 (and optional ballast from others);
    ``loss`` is a tensor, or the float a resumed checkpoint saved."""
    loss = float(loss)
    slow = config.get("slow_rank")  # a straggler: {"rank": R, "sleep_s": S} before each report
    if slow and et.get_context().get_world_rank() == slow["rank"]:
        time.sleep(slow["sleep_s"])
    metrics = {"loss": loss, "epoch": epoch, "jit": jit,
               "score": config.get("scores", {}).get(str(epoch), float(epoch)),
               **{name: float(epoch) for name in config.get("extra_metrics", ())}}
    with tempfile.TemporaryDirectory() as d:
        checkpoint = None
        if et.get_context().get_world_rank() == 0:
            state = {"model": getattr(model, "module", model).state_dict(),
                     "optimizer": optimizer.state_dict(),
                     "epoch": epoch, "epoch_done": epoch_done, "loss": loss}
            if config.get("process_save"):  # written by a writer process
                if config.get("state_ballast_mb"):  # a write long enough to be cut
                    state["ballast"] = torch.zeros(config["state_ballast_mb"] << 18)
                checkpoint = async_save(state, "state.pt")
            else:
                torch.save(state, os.path.join(d, "state.pt"))
                checkpoint = et.Checkpoint.from_directory(d)
        elif config.get("ballast_mb"):  # large files from another rank: slow uploads
            files = config.get("ballast_files", 1)
            for i in range(files):
                name = config.get("ballast_name", "ballast.bin") if files == 1 \
                    else f"ballast_{i:03d}.bin"
                with open(os.path.join(d, name), "wb") as f:
                    f.write(os.urandom((config["ballast_mb"] << 20) // files))
            checkpoint = et.Checkpoint.from_directory(d)
        et.report(metrics, checkpoint=checkpoint,
                  checkpoint_upload_mode=config.get("upload_mode", "ASYNC"))
