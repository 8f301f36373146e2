"""One worker of a running group replaced in torch's process context, the others left alone.

torch's ``SubprocessContext`` starts, watches and stops the whole group at
once; it has no call that starts one worker again. An in-process restart needs
exactly that: the survivors keep running and a dead (or killed) rank gets a
new process. :func:`replace_worker` starts it with the environment and
arguments torch gave the slot, its output appended to the slot's log files,
and puts it in the slot's place (the handler, and the pid torch compares
with the worker group's). See docs/TORCH_INTERNALS.md.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

from torch.distributed.elastic.agent.server.api import Worker
from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler


class _AppendingHandler(SubprocessHandler):
    """torch's handler, with the log files opened for appending: the replaced worker's
    output stays above the new one's (torch's truncates, for a fresh group).

    torch's own ``__init__`` builds the command, so what it adds to it is kept:
    under ``--numa-binding`` the ``numactl`` binding of the slot's device (torch
    2.14 wraps with ``torch.numa.binding._maybe_wrap_command_args_with_numa_binding``;
    2.9 to 2.13 with helpers of other names and arguments, called from the same
    place). Only the opening of the log files is ours, in :meth:`_popen`.
    """

    def __init__(self, args: tuple[str, ...], env: dict[str, str], stdout: str | None,
                 stderr: str | None, local_rank: int, numa_options: Any = None):
        self._append_to = (stdout, stderr)
        super().__init__(entrypoint=args[0], args=args[1:], env=env, stdout=None,
                         stderr=None, local_rank_id=local_rank, numa_options=numa_options)

    def _popen(self, args: tuple, env: dict[str, str]) -> Any:
        stdout, stderr = self._append_to
        self._stdout = open(stdout, "a") if stdout else None  # noqa: SIM115 -- owned by handler
        self._stderr = open(stderr, "a") if stderr else None  # noqa: SIM115
        return super()._popen(args, env)


def surviving(pids: list[int], wait_s: float = 1.0) -> dict[int, str]:
    """Of ``pids``, those still alive after ``wait_s`` (zombies count as gone): pid -> state."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = {}
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state not in ("Z", "X"):
                alive[pid] = state
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.01)


def kill(pids: list[int], wait_s: float = 2.0) -> dict[int, str]:
    """SIGKILLs ``pids``; returns those still there after ``wait_s`` (see :func:`surviving`)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return surviving(pids, wait_s)


def replace_worker(pcontext: Any, worker: Worker, entrypoint: str, args: tuple[str, ...],
                   env: dict[str, str]) -> int:
    """Starts a new process in ``worker``'s slot of ``pcontext``; returns its pid.

    ``env`` is added to the environment torch gave the slot. The slot's previous
    process must be gone (it is reaped here); its error file is removed, so that
    an error it left is not taken for the new process's.
    """
    local_rank = worker.local_rank
    old = pcontext.subprocess_handlers[local_rank]
    with contextlib.suppress(Exception):
        old.proc.kill()
        old.proc.wait(timeout=5)
    for stream in (old._stdout, old._stderr):
        if stream is not None:
            stream.close()
    error_file = pcontext.error_files[local_rank]
    if error_file and os.path.exists(error_file):
        os.remove(error_file)
    handler = _AppendingHandler((entrypoint, *map(str, args)),
                                {**pcontext.envs[local_rank], **env},
                                pcontext.stdouts[local_rank], pcontext.stderrs[local_rank],
                                local_rank, getattr(pcontext, "_numa_options", None))
    pcontext.subprocess_handlers[local_rank] = handler
    pcontext._running_local_ranks.add(local_rank)
    worker.id = handler.proc.pid
    return handler.proc.pid
