"""The deterministic DDP workload every variant runs: an MLP on synthetic data.

Both harnesses -- the torchrun worker script and the elastic-train driver --
call :func:`train` with their own :class:`Hooks` (what to do after a step,
after an epoch, and how to resume), so the measured loop is the same code.
The data is generated in-process from a seeded ``torch.Generator``: each rank
gets its own fixed shard, reused every epoch, and the labels come from a fixed
random "teacher" so the loss actually goes down.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import torch
from torch import nn

from bench.events import EventLog


@dataclass(frozen=True)
class WorkloadConfig:
    """Sizes and switches of one run; JSON-serialisable so it can go on a command line.

    ``payload_mb`` adds a fixed tensor to the checkpointed state (figure 3 uses
    it to reach ~100 MB without making every step slow). ``report_every`` is
    ``"epoch"`` or ``"step"`` (metrics-only reports every step, the checkpoint
    still once per epoch). ``upload_mode`` is elastic-train's
    ``checkpoint_upload_mode``. ``checkpoint`` turns per-epoch checkpoints off.
    ``report_api`` makes the torchrun-style worker script use elastic-train's
    ``report()``/``get_checkpoint()`` instead of its own ``torch.save`` (d).
    ``namespaced_store`` makes it join the process group through a store prefixed
    with the restart count (the workaround for torchrun's failing gloo restarts).
    ``fault`` (``"exception"``, ``"exit"`` or ``"sigkill"``) makes rank ``fault_rank``
    fail in the first attempt after step ``fault_step`` of epoch ``fault_epoch``: its
    train function raises, its process exits with code 1, or it SIGKILLs itself, right
    after a ``fault`` event. ``in_process`` wraps the torchrun-style worker's main in
    ``elastic_train.restart_in_process`` (variant d').
    ``device`` is ``"cpu"`` (gloo) or ``"cuda"`` (nccl, one GPU per worker: the GPU
    figure); ``optimizer`` is ``"sgd"`` (with momentum) or ``"adam"``. ``probe`` adds the
    GPU figure's events: the device and torch version, the device memory at the start
    of every attempt and the final weights' digest (:func:`attempt_started`).
    """

    input_dim: int = 512
    hidden: int = 1024
    layers: int = 2
    classes: int = 10
    batch: int = 128
    steps_per_epoch: int = 20
    epochs: int = 4
    seed: int = 1234
    lr: float = 0.05
    threads: int = 1
    payload_mb: int = 0
    checkpoint: bool = True
    report_api: bool = False
    namespaced_store: bool = False
    report_every: str = "epoch"
    upload_mode: str = "ASYNC"
    fault: str = ""
    fault_rank: int = 1
    fault_epoch: int = 1
    fault_step: int = 5
    in_process: bool = False
    restart_in_process: bool = True
    device: str = "cpu"
    optimizer: str = "sgd"
    probe: bool = False
    events_dir: str = ""
    ckpt_dir: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkloadConfig:
        return cls(**json.loads(text))

    def replace(self, **changes: Any) -> WorkloadConfig:
        return WorkloadConfig(**{**asdict(self), **changes})


class Hooks(Protocol):
    """What a harness adds around the shared loop."""

    def restore(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
        """Loads the latest saved state, if any; returns the epoch to start at."""

    def after_step(self, epoch: int, step: int, loss: float) -> None:
        """Called after every optimizer step."""

    def after_epoch(self, epoch: int, loss: float, state: dict[str, Any]) -> None:
        """Called after every epoch with the state to checkpoint."""


def build_model(cfg: WorkloadConfig) -> nn.Module:
    """The MLP, initialised identically on every rank."""
    torch.manual_seed(cfg.seed)
    dims = [cfg.input_dim] + [cfg.hidden] * cfg.layers
    blocks: list[nn.Module] = []
    for d_in, d_out in zip(dims[:-1], dims[1:], strict=True):
        blocks += [nn.Linear(d_in, d_out), nn.ReLU()]
    blocks.append(nn.Linear(dims[-1], cfg.classes))
    return nn.Sequential(*blocks)


def make_optimizer(cfg: WorkloadConfig, model: nn.Module) -> torch.optim.Optimizer:
    if cfg.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=cfg.lr)
    return torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)


def parameter_count(cfg: WorkloadConfig) -> int:
    dims = [cfg.input_dim] + [cfg.hidden] * cfg.layers + [cfg.classes]
    return sum(d_in * d_out + d_out for d_in, d_out in zip(dims[:-1], dims[1:], strict=True))


def use_device(cfg: WorkloadConfig) -> None:
    """Before the process group: the GPU of this rank (``LOCAL_RANK``), deterministic
    cuBLAS and kernels, so that a resumed run can end bit-identical. Nothing on CPU."""
    if cfg.device != "cuda":
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    torch.use_deterministic_algorithms(True, warn_only=True)


def attempt_started(cfg: WorkloadConfig, log: EventLog) -> None:
    """With ``probe``: this attempt's ``attempt`` event -- the device (name, torch, CUDA,
    whether torch marked the process a bad fork) and the device memory the process holds
    before the attempt builds anything: allocated, the peak so far, reserved (None on
    CPU)."""
    if not cfg.probe:
        return
    cuda = cfg.device == "cuda"
    memory = {name: getattr(torch.cuda, name)() / 2**20 if cuda else None
              for name in ("memory_allocated", "max_memory_allocated", "memory_reserved")}
    log.emit("attempt", device=torch.cuda.get_device_name() if cuda else "cpu",
             torch=torch.__version__, cuda=torch.version.cuda,
             bad_fork=bool(getattr(torch.cuda, "_is_in_bad_fork", lambda: False)()),
             **{f"{name}_mb": value for name, value in memory.items()})


def weights_digest(model: nn.Module) -> str:
    """SHA-256 over every tensor's name and bytes: equal only if bit-identical."""
    digest = hashlib.sha256()
    for name, tensor in sorted(unwrap(model).state_dict().items()):
        data = tensor.detach().cpu().contiguous()
        digest.update(name.encode())
        if data.numel():  # no numpy needed: the bytes straight from the tensor's memory
            digest.update(ctypes.string_at(data.data_ptr(), data.numel() * data.element_size()))
    return digest.hexdigest()


def make_shard(cfg: WorkloadConfig, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's fixed synthetic inputs and teacher labels (one epoch's worth)."""
    teacher = torch.randn(cfg.input_dim, cfg.classes,
                          generator=torch.Generator().manual_seed(cfg.seed))
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + rank + 1)
    x = torch.randn(cfg.steps_per_epoch * cfg.batch, cfg.input_dim, generator=gen)
    return x, (x @ teacher).argmax(dim=1)


def make_payload(cfg: WorkloadConfig) -> torch.Tensor | None:
    """The extra checkpoint bytes (``payload_mb`` MiB of seeded noise), or None."""
    if cfg.payload_mb <= 0:
        return None
    numel = cfg.payload_mb * 2**20 // 4
    return torch.randn(numel, generator=torch.Generator().manual_seed(cfg.seed + 7))


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside a DistributedDataParallel wrapper (or the model itself)."""
    inner = getattr(model, "module", model)
    return inner if isinstance(inner, nn.Module) else model


def checkpoint_state(model: nn.Module, optimizer: torch.optim.Optimizer, epoch: int,
                     payload: torch.Tensor | None) -> dict[str, Any]:
    """What both harnesses save: model, optimizer, epoch (and the payload, if any)."""
    state: dict[str, Any] = {"model": unwrap(model).state_dict(),
                             "optimizer": optimizer.state_dict(), "epoch": epoch}
    if payload is not None:
        state["payload"] = payload
    return state


def load_state(state: dict[str, Any], model: nn.Module,
               optimizer: torch.optim.Optimizer) -> int:
    """Restores a :func:`checkpoint_state` dict; returns the next epoch."""
    unwrap(model).load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["epoch"]) + 1


def fail(how: str, log: EventLog) -> None:
    """The injected fault, stamped first (the recovery figures count from it)."""
    log.emit("fault", how=how)
    if how == "exception":
        raise RuntimeError("injected fault")
    sys.stdout.flush()
    if how == "exit":
        os._exit(1)
    os.kill(os.getpid(), signal.SIGKILL)


def train(cfg: WorkloadConfig, model: nn.Module, rank: int, hooks: Hooks, log: EventLog) -> float:
    """Runs the epochs from the resume point; returns the last loss.

    ``model`` is already wrapped for data parallelism by the caller.
    """
    optimizer = make_optimizer(cfg, model)
    start = hooks.restore(model, optimizer)
    log.emit("restored", epoch=start)
    x, y = make_shard(cfg, rank)
    if cfg.device != "cpu":
        device = next(model.parameters()).device
        x, y = x.to(device), y.to(device)
    payload = make_payload(cfg)
    loss_fn = nn.CrossEntropyLoss()
    loss_value = float("nan")
    steady = SteadyClock()
    for epoch in range(start, cfg.epochs):
        if epoch == start + 1:  # the first epoch warms up (allocator, gloo buffers, caches)
            steady.start()
        for step in range(cfg.steps_per_epoch):
            rows = slice(step * cfg.batch, (step + 1) * cfg.batch)
            loss = loss_fn(model(x[rows]), y[rows])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_value = loss.item()
            log.step_done()
            steady.step()
            hooks.after_step(epoch, step, loss_value)
            if cfg.fault and (epoch, step, rank, log.restart) == (
                    cfg.fault_epoch, cfg.fault_step, cfg.fault_rank, 0):
                fail(cfg.fault, log)
        state = checkpoint_state(model, optimizer, epoch, payload) if cfg.checkpoint else {}
        hooks.after_epoch(epoch, loss_value, state)
        log.emit("epoch_end", epoch=epoch, loss=loss_value)
    if steady.steps:
        log.emit("steady", **steady.totals())
    if cfg.probe and rank == 0:
        log.emit("final", digest=weights_digest(model))
    log.emit("done")
    return loss_value


class SteadyClock:
    """Wall time and CPU time of the steady-state epochs (every epoch after the first
    of this process), each epoch's report()/checkpoint included: what a step costs.

    ``thread_cpu_s`` is the training thread's own CPU clock; ``process_cpu_s`` adds
    every other thread of the worker (gloo's, elastic-train's uploader). CPU clocks
    count only this process's work, so another process's load on the machine
    changes them far less than wall time.
    """

    def __init__(self) -> None:
        self.steps = 0
        self._origin: tuple[float, float, float] | None = None

    def start(self) -> None:
        self._origin = (time.perf_counter(), time.thread_time(), time.process_time())

    def step(self) -> None:
        if self._origin is not None:
            self.steps += 1

    def totals(self) -> dict[str, float]:
        wall, thread, process = self._origin or (0.0, 0.0, 0.0)
        return {"steps": self.steps, "wall_s": time.perf_counter() - wall,
                "thread_cpu_s": time.thread_time() - thread,
                "process_cpu_s": time.process_time() - process}
