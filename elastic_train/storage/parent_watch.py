"""A helper process that ends the moment the process it works for ends.

Checkpoint writer processes (:mod:`.file_writer`, and torch's DCP writer process,
see :mod:`.dcp_writer`) must not outlive their worker: a SIGKILLed worker's writer
would go on writing a checkpoint nobody commits, holding its memory and CPU.
``PR_SET_PDEATHSIG`` cannot promise it: it fires when the *thread* that started the
child exits, and torch starts its writer from an executor thread that ends after
the first save. So a thread in the writer watches its owner instead, through a
pidfd (Linux 5.3+; elsewhere by polling the parent pid), and SIGKILLs the writer
once the owner is gone -- with every process it started, if any (a validation's, see
:mod:`elastic_train.worker.validation_process`). Files half written then stay in a
directory nobody commits.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time

from elastic_train._internal.process_identity import end_tree

_POLL_S = 0.2
_watched: int | None = None  # the owner this process watches, once started


def die_with(owner_pid: int) -> None:
    """Makes this process die (SIGKILL), with what it started, when ``owner_pid``, its
    parent, ends: at once when it has ended already. Idempotent: one watch per process."""
    global _watched
    if _watched == owner_pid:
        return
    _watched = owner_pid
    if os.getppid() != owner_pid:
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=_watch, args=(owner_pid,), name="owner-watch", daemon=True).start()


def _watch(owner_pid: int) -> None:
    try:
        fd = os.pidfd_open(owner_pid)
    except (AttributeError, OSError):  # no pidfd here, or the owner is gone already
        while os.getppid() == owner_pid:
            time.sleep(_POLL_S)
    else:
        select.select([fd], [], [])  # readable once the owner has exited
    end_tree(os.getpid())
