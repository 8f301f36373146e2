"""What the zygote imports beyond torch, so that a restarted worker pays only fork and setup.

Two sources:

- :data:`FIRST_STEP`: what torch imports lazily on a training step's first
  use, measured by profiling the first step of a DDP workload in a process
  forked from the zygote: ``DistributedDataParallel(...)`` and the first
  optimizer import ``torch._dynamo`` (with sympy and more: ~900 modules,
  1.5-5 s of CPU here), a DataLoader with workers imports multiprocessing's
  queues. Every new worker paid that again.
- The modules the workers actually imported: each node's local rank 0 lists
  them at its first ``report()`` (:mod:`elastic_train.worker.module_report`),
  and the agent hands the list to the zygote (:func:`ask_to_preload`), with
  whether they use CUDA (for the zygote's standby, :mod:`.standby`).

A module is preloaded only if importing it is safe in a process that forks:
:func:`probe` imports each candidate in a throw-away child of the zygote and
skips -- and names -- any that starts a thread, initialises CUDA or fails --
for at most :data:`PROBE_BUDGET_S` (the zygote forks no worker meanwhile).
Modules of the user's own code (:mod:`elastic_train.worker.user_code`) are not
candidates: they may read the worker's environment (``RANK``...) at import.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import logging
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

PROBE_BUDGET_S = 5.0
FIRST_STEP = ("torch._dynamo", "torch.nn.parallel", "torch.optim", "torch.utils.data",
              "multiprocessing.queues", "multiprocessing.popen_fork")


def _tasks() -> int:
    return len(os.listdir("/proc/self/task"))


def _try_import(name: str) -> str:
    """Imports ``name`` here; returns why it must not be preloaded ('' when it may be)."""
    tasks = _tasks()
    try:
        importlib.import_module(name)
    except BaseException as exc:  # noqa: BLE001 -- any failure disqualifies it
        return f"its import failed ({type(exc).__name__})"
    if _tasks() > tasks:
        return "its import started a thread"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "its import initialised CUDA"
    return ""


POISON_CHECK_EVERY_S = 0.5  # a poison check forks the probing child (~40 ms here)
POISONS = "its import poisons forks (it asked the CUDA runtime for devices)"
_CLEAN, _POISONED = "<clean>", "<poisoned>"  # a child's check lines, between verdicts


def probe(candidates: list[str], budget_s: float | None = None
          ) -> tuple[list[str], dict[str, str], list[str]]:
    """Imports ``candidates`` in forked children of this process, in order: returns the
    safe ones, why the others are not, and those not probed within ``budget_s``
    (:data:`PROBE_BUDGET_S`: the zygote serves no fork meanwhile, so a restart would
    wait). A child that a module taints (a thread, CUDA) stops there; the next child
    goes on after that module.

    torch's fork poison (a ``torch.cuda.is_available()`` at import) leaves no trace in
    the importing process; only its forks see it. So a child checks its own forks every
    :data:`POISON_CHECK_EVERY_S` and at its end, and only verdicts a clean check
    follows count. When a check finds poison, the modules since the last clean one are
    probed again, half as many at a time, until the first that poisons is found (none
    are checked where this process's forks are poisoned already)."""
    deadline = time.monotonic() + (PROBE_BUDGET_S if budget_s is None else budget_s)
    remaining = [name for name in candidates if name not in sys.modules]
    safe: list[str] = []
    skipped: dict[str, str] = {}
    limit = len(remaining)  # how many the next child may import
    while remaining and time.monotonic() < deadline:
        verdicts, unconfirmed, poisoned = _probe_in_child(remaining[:limit], deadline)
        limit = len(remaining)
        if poisoned and unconfirmed <= 1:  # found: the one module since a clean check
            verdicts.append((remaining[len(verdicts)], POISONS))
        elif poisoned or unconfirmed:  # bisect the poisoned ones; confirm a dead child's
            limit = len(verdicts) + max(unconfirmed // 2 if poisoned else unconfirmed, 1)
        elif not verdicts:  # the child died, or ran out of time, at the first module
            verdicts = [(remaining[0], "its import crashed the process"
                         if time.monotonic() < deadline else "its import took too long")]
        for name, why in verdicts:
            if why:
                skipped[name] = why
            else:
                safe.append(name)
        remaining = remaining[len(verdicts):]
        limit -= len(verdicts)
    return safe, skipped, remaining


def _probe_in_child(names: list[str], deadline: float
                    ) -> tuple[list[tuple[str, str]], int, bool]:
    """Probes ``names`` in one forked child: the verdicts a clean poison check confirmed,
    how many more it gave that no clean check followed, and whether a check found
    poison (then those are the modules it imported since the last clean check)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the zygote's handler would reap
        with os.fdopen(write_end, "w") as out:
            _probe_here(names, out)
        os._exit(0)
    os.close(write_end)
    confirmed: list[tuple[str, str]] = []
    pending: list[tuple[str, str]] = []
    poisoned = False
    with os.fdopen(read_end, "rb", buffering=0) as lines:  # unbuffered: select sees all
        while not poisoned and select.select([lines], [], [],
                                             max(deadline - time.monotonic(), 0))[0]:
            line = lines.readline()
            if not line:
                break
            name, why = json.loads(line)
            poisoned = name == _POISONED
            if name == _CLEAN:
                confirmed, pending = confirmed + pending, []
            elif not poisoned:
                pending.append((name, why))
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)  # out of time (or done: then already gone)
    with contextlib.suppress(ChildProcessError):  # the zygote's SIGCHLD handler reaped it
        os.waitpid(pid, 0)
    return confirmed, len(pending), poisoned


def _probe_here(names: list[str], out) -> None:
    """In the probing child: a verdict line per module, a check line now and then (none
    where the forks were poisoned before it imported anything: nothing to find)."""
    from elastic_train.agent.zygote.fork import forks_are_poisoned

    check_poison = not forks_are_poisoned()

    def check() -> bool:
        poisoned = check_poison and forks_are_poisoned()
        out.write(json.dumps([_POISONED if poisoned else _CLEAN, ""]) + "\n")
        out.flush()
        return not poisoned

    checked = None  # the first verdict is checked at once: a probe cut short keeps it
    for name in names:
        why = _try_import(name)
        out.write(json.dumps([name, why]) + "\n")
        out.flush()
        if why and not why.startswith("its import failed"):
            break  # this process is tainted: a fresh child checks the rest
        if checked is None or time.monotonic() - checked > POISON_CHECK_EVERY_S:
            if not check():
                return
            checked = time.monotonic()
    check()


def preload_here(candidates: list[str]) -> dict:
    """In the zygote: imports the safe candidates; returns what was preloaded and skipped."""
    safe, skipped, unprobed = probe(candidates)
    loaded = []
    for name in safe:
        with contextlib.suppress(BaseException):
            importlib.import_module(name)
            loaded.append(name)
    gc.freeze()  # as after the first imports: workers' collections must not touch them
    return {"preloaded": loaded, "skipped": skipped, "unprobed": len(unprobed)}


def ask_to_preload(socket_path: str, modules: list[str], cuda: bool = False) -> dict | None:
    """The agent's request to the zygote at ``socket_path`` (``cuda``: the workers use
    CUDA, so its standby warms it): the zygote's answer, or None if it did not answer."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
            sock.connect(socket_path)
            sock.send(json.dumps({"preload": modules, "cuda": cuda}).encode())
            return json.loads(sock.recv(1 << 22) or b"null")
    except (OSError, ValueError):
        return None


class ImportWatch:
    """The agent's side: hands the first list of modules a worker reports (see
    :mod:`elastic_train.worker.module_report`) to the zygote, once, on a thread of its own
    (the zygote probes and imports for a while), and says which it did not preload."""

    def __init__(self, directory: str, send: Callable[[list[str], bool], dict | None]):
        self.directory = directory
        self._send = send
        self._sent = False
        self.result: dict | None = None

    def poll(self) -> None:
        if self._sent or not os.path.isdir(self.directory):
            return
        reports = sorted(n for n in os.listdir(self.directory) if n.endswith(".json"))
        if not reports:
            return
        self._sent = True
        with open(os.path.join(self.directory, reports[0])) as f:
            report = json.load(f)
        threading.Thread(target=self._hand_over, args=(report["modules"], report["cuda"]),
                         name="zygote-preload", daemon=True).start()

    def _hand_over(self, modules: list[str], cuda: bool) -> None:
        self.result = self._send(modules, cuda)
        skipped = (self.result or {}).get("skipped") or {}
        if skipped:
            logger.warning("The worker zygote does not preload %s; new workers import them "
                           "themselves.", "; ".join(f"{name} ({why})" for name, why in
                                                   sorted(skipped.items())))
        if unprobed := (self.result or {}).get("unprobed"):
            logger.info("The worker zygote did not probe %d more modules within %.0f s; new "
                        "workers import them themselves.", unprobed, PROBE_BUDGET_S)
