"""Worker progress, as the agent sees it: a file per rank touched when the worker advances.

A worker beats when a report is done (an after-report hook, see
:mod:`.after_report`) and when it takes a batch from a dataset shard or a
prepared data loader (at most once a second, one ``utime`` call). The
agent declares a hang when a rank's file is older than
``FailureConfig(hang_timeout_s)``. The worker also arms ``faulthandler`` on
SIGUSR1, so the agent can have each rank write its Python stack before it
kills a hung group.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import time

from elastic_train._internal import env_vars

STACK_SIGNAL = signal.SIGUSR1
_last = 0.0
_stack_file = None


def progress_file(directory: str, rank: int) -> str:
    return os.path.join(directory, f"rank{rank}.beat")


def stack_file(directory: str, rank: int) -> str:
    return os.path.join(directory, f"rank{rank}.stack")


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def arm() -> None:
    """At worker start: the stack dump on SIGUSR1. No beat yet: the hang timeout starts
    once the first report is done or the first batch taken, so slow start-up work
    (imports, building the model, loading a checkpoint) falls under the agent's
    start-up allowance instead."""
    global _stack_file
    directory = env_vars.AgentFacts.from_environ().progress_dir
    if not directory:
        return
    os.makedirs(directory, exist_ok=True)
    # Appending: when the agent empties the file (a restart), the next dump starts at 0.
    _stack_file = open(stack_file(directory, _rank()), "a")  # noqa: SIM115 -- for the process
    faulthandler.register(STACK_SIGNAL, file=_stack_file, all_threads=True)


def beat() -> None:
    """Marks progress (cheap: at most one file touch a second)."""
    global _last
    directory = env_vars.AgentFacts.from_environ().progress_dir
    now = time.monotonic()
    if not directory or now - _last < 1.0:
        return
    _last = now
    path = progress_file(directory, _rank())
    with open(path, "a"):
        os.utime(path)
