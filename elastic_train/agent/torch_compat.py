"""Which torch is installed, and the one place that handles what differs between versions.

elastic-train supports the torch releases its tests run on: :data:`OLDEST` to
:data:`NEWEST` (``pyproject.toml``'s floor is :data:`OLDEST`; CI runs the whole
suite on the newest and the ``compat`` tests on 2.9 and 2.11). Importing this
module refuses any other torch with one line naming the range, before anything
of torch's private parts is used (the agent modules import it first). Where a
part of torch that we touch differs between the supported versions, the
difference is decided here, by looking at torch itself, never by callers;
docs/TORCH_INTERNALS.md has a column per version.
"""

from __future__ import annotations

import argparse
import inspect
import re
import signal
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.elastic.agent.server.api import WorkerSpec
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

from elastic_train.errors import ConfigError

OLDEST = (2, 9)
NEWEST = (2, 14)


class UnsupportedTorchError(ConfigError):
    """The installed torch is outside the range elastic-train is tested on."""


def _minor(version: str) -> tuple[int, int] | None:
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found[1]), int(found[2])) if found else None


def supported_range() -> str:
    return f"torch {OLDEST[0]}.{OLDEST[1]} to {NEWEST[0]}.{NEWEST[1]}"


def check_version(version: str) -> None:
    """Raises :class:`UnsupportedTorchError` (one line) unless ``version`` is in range."""
    minor = _minor(version)
    if minor is None or not OLDEST <= minor <= NEWEST:
        raise UnsupportedTorchError(
            f"torch {version} is not supported: elastic-train supports {supported_range()}; "
            f"install one in that range (pip install 'torch>={OLDEST[0]}.{OLDEST[1]},"
            f"<{NEWEST[0]}.{NEWEST[1] + 1}').")


check_version(torch.__version__)


def _takes(function: Callable[..., Any], name: str) -> bool:
    return name in inspect.signature(function).parameters


# torch 2.12 added LocalElasticAgent(shutdown_timeout=) and _shutdown(death_sig, timeout);
# before, the agent closes its workers with the process context's default 30 s wait.
AGENT_SHUTDOWN_TIMEOUT = _takes(LocalElasticAgent.__init__, "shutdown_timeout")
SHUTDOWN_TAKES_TIMEOUT = _takes(LocalElasticAgent._shutdown, "timeout")
# torch 2.10 added WorkerSpec(virtual_local_rank=) (torchrun's --virtual-local-rank).
VIRTUAL_LOCAL_RANK = "virtual_local_rank" in inspect.signature(WorkerSpec).parameters


def agent_options(shutdown_timeout: int) -> dict[str, Any]:
    """``LocalElasticAgent``'s keyword arguments for the stop timeout (none before 2.12:
    :func:`shutdown` applies it there)."""
    return {"shutdown_timeout": shutdown_timeout} if AGENT_SHUTDOWN_TIMEOUT else {}


def worker_spec_options(numa_binding: str | None, virtual_local_rank: bool) -> dict[str, Any]:
    """``WorkerSpec``'s keyword arguments for ``--numa-binding`` and ``--virtual-local-rank``."""
    options: dict[str, Any] = {}
    if numa_binding:
        from torch.numa.binding import AffinityMode, NumaOptions

        options["numa_options"] = NumaOptions(affinity_mode=AffinityMode(numa_binding))
    if virtual_local_rank:
        if not VIRTUAL_LOCAL_RANK:
            raise ConfigError(f"virtual_local_rank needs torch 2.10 or newer; this is torch "
                              f"{torch.__version__}.")
        options["virtual_local_rank"] = True
    return options


def shutdown(torch_shutdown: Callable[..., None], pcontext: Any,
             death_sig: signal.Signals, timeout: int) -> None:
    """Calls torch's ``LocalElasticAgent._shutdown`` so that it waits ``timeout`` seconds
    between ``death_sig`` and SIGKILL: torch before 2.12 takes no timeout and closes the
    process context with its 30 s default, so the context's close is given it."""
    if SHUTDOWN_TAKES_TIMEOUT:
        torch_shutdown(death_sig, timeout)
        return
    if pcontext is None:
        torch_shutdown(death_sig)
        return
    close = pcontext.close

    def close_within(death_sig: signal.Signals | None = None, _timeout: int = 30) -> None:
        close(death_sig, timeout)

    pcontext.close = close_within
    try:
        torch_shutdown(death_sig)
    finally:
        pcontext.close = close


KEEP_ALIVE_STOP_S = 1.0  # the most an ending agent waits for torch's heartbeat in flight


def stop_keep_alive(handler: Any, wait_s: float = KEEP_ALIVE_STOP_S) -> None:
    """Stops the keep-alive heartbeats of torch's dynamic rendezvous handler without
    closing its rendezvous (the other nodes may go on), and waits at most ``wait_s`` for
    a heartbeat in flight. torch's own ``_stop_heartbeats`` waits without a bound (a store
    that stopped answering holds it for the store's timeout), and its ``shutdown`` closes
    the rendezvous. A heartbeat still in a store call when the interpreter finalizes
    aborts the process: its daemon thread leaves through ``pthread_exit`` inside C++
    ("terminate called without an active exception", SIGABRT instead of the exit code).
    Handlers without torch's timer (other backends): nothing to do."""
    timer = getattr(handler, "_keep_alive_timer", None)
    context, thread = getattr(timer, "_ctx", None), getattr(timer, "_thread", None)
    if context is None or thread is None:
        return
    context.stop_event.set()
    thread.join(wait_s)


def torchrun_parser() -> argparse.ArgumentParser:
    """torchrun's parser (``elastic-train launch``'s), with one default made the same on
    every version: ``--master-port`` is unset unless given (torch before 2.12 defaults it to
    29500; from 2.12 on, torchrun gives a one-node job without a port or endpoint a local
    store on a free port, and so does ``launch`` on every version). Flags a torch lacks
    (``--shutdown-timeout`` before 2.12, ``--signals-to-handle`` and
    ``--virtual-local-rank`` before 2.10, ...) are not there: they are that torch's."""
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    for action in parser._actions:
        if action.dest == "master_port":
            action.default = None
    return parser
