"""A worker forked before it is needed, waiting to take the next slot: the *standby*.

A worker that replaces a dead rank pays, after the fork, for what every new
process pays before its first step; on a GPU the largest part is the CUDA
context (the driver's initialisation and the device's context: about 0.3-0.5 s
of an in-process restart's 1 s on one H200, #23). The zygote may not pay it ahead: a
process that touched CUDA cannot fork workers (see :mod:`.fork`). So the zygote
keeps one child forked ahead, its *standby*, that did what it can do without a
slot, and hands it the next request instead of forking:

- the standby is forked when the zygote has served its first request and has
  been idle for :data:`IDLE_S`; so again after each hand-over; at once after the
  zygote preloaded new modules (see :mod:`.preload`), which an older standby
  lacks (the older one is then retired);
- when the workers use CUDA (their first ``report()`` says so, see
  :mod:`elastic_train.worker.module_report`), the standby initialises CUDA (driver
  and runtime) under the CUDA variables of the last request (:func:`device_env`),
  so that a request with other ones is served by a fork instead (CUDA cannot
  change its visible devices); where one device is visible (one GPU per node, or
  per worker) it also creates that device's primary context. With several it
  cannot know which device the slot uses, and a context on each would stay in
  the worker for good;
- a hand-over is a request passed on, streams and all, over the standby's own
  socket; the standby then becomes the worker exactly as a forked child does,
  and the zygote answers the client with the standby's pid;
- a standby that died without a request is forked again, up to
  :data:`MAX_LOST` times per zygote.

The cost: one more process per node, whose pages are the zygote's (shared),
and, where the workers use CUDA on a single visible device, its context's device
memory (a few hundred MiB). ``ELASTIC_TRAIN_STANDBY=0`` in the
environment of ``fit()`` or ``launch`` turns it off.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
from collections.abc import Mapping
from dataclasses import dataclass

# How long the zygote waits, idle, before it forks a standby: not while a group starts
# or a replacement joins (the fork, and warming CUDA, would take CPU from them).
IDLE_S = 1.0
MAX_LOST = 3  # standbys that may die unasked before the zygote keeps none
# Read when CUDA initialises (which devices, their order, the allocator, lazy loading):
# a context created under other values would not be what the request asked for.
DEVICE_ENV_PREFIXES = ("CUDA_", "PYTORCH_", "NVIDIA_", "HIP_", "ROCR_")


def device_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` that CUDA (or torch's device set-up) reads at its start."""
    return {k: v for k, v in env.items() if k.startswith(DEVICE_ENV_PREFIXES)}


@dataclass(frozen=True)
class Warmth:
    """What a standby prepares: ``cuda``, CUDA initialised (and the context of a single
    visible device), under ``env`` (:func:`device_env` of the request it followed)."""

    cuda: bool = False
    env: tuple[tuple[str, str], ...] = ()

    def serves(self, env: Mapping[str, str]) -> bool:
        """Whether a standby warmed so may become a worker with environment ``env``."""
        return not self.cuda or dict(self.env) == device_env(env)


@dataclass
class Standby:
    """The zygote's side of its standby: the child's pid, the socket that hands it a
    request, and what it warmed."""

    pid: int
    sock: socket.socket
    warmth: Warmth

    def hand_over(self, message: bytes, fds: list[int]) -> bool:
        """Passes a client's request to the standby; False if it is gone."""
        try:
            socket.send_fds(self.sock, [message], fds)
        except OSError:
            return False
        return True

    def retire(self) -> None:
        """Kills the standby (the zygote reaps it)."""
        self.sock.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


def note(path: str, pid: int | None) -> None:
    """In the zygote: records its standby's pid at ``path`` (beside its socket), or that
    it has none, for :func:`noted`."""
    if pid is None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        return
    with open(f"{path}.tmp", "w") as f:
        f.write(str(pid))
    os.replace(f"{path}.tmp", path)


def noted(path: str) -> int | None:
    """The pid of the standby waiting now, as the zygote noted it at ``path``."""
    try:
        with open(path) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def warm(warmth: Warmth) -> None:
    """In the standby: creates what :class:`Warmth` asks for. A failure is left to the
    worker this becomes, which meets it at its own first CUDA call."""
    if not warmth.cuda:
        return
    for key in [k for k in os.environ if k.startswith(DEVICE_ENV_PREFIXES)]:
        del os.environ[key]
    os.environ.update(dict(warmth.env))
    import torch

    with contextlib.suppress(Exception):
        torch.cuda.init()
        if torch.cuda.device_count() == 1:  # then it is the slot's device
            torch.cuda.synchronize(0)  # creates the device's primary context


def wait_for_request(sock: socket.socket) -> tuple[dict, list[int]] | None:
    """In the standby: the request the zygote hands over (its fields and the client's
    descriptors), or None when the zygote retired it or exited."""
    try:
        message, fds, _, _ = socket.recv_fds(sock, 1 << 22, 3)
    except OSError:
        return None
    return (json.loads(message), fds) if message else None
