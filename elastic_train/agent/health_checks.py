"""A node's checks of itself: its devices, its disks, its storage, and the user's own.

A node that fails one should leave the job rather than fail it again (issue #26:
a node checks itself before it joins a round and after a failure charged to it;
the node policy, :mod:`elastic_train.agent.node_policy`, decides what a failed
check costs). Each check says what it found in one line, and how long it took.

Nothing here touches the CUDA runtime, NVML or the user's code in the agent's own
process, which the worker zygote is forked from (see :mod:`elastic_train._internal.devices`):
the device check and the user's callables run in a forked child
(:mod:`elastic_train._internal.forked_call`), the user's command in a child process.

Built in:

- :class:`DeviceCheck`: on each visible device (or the CPU), create the context,
  multiply two matrices of ones and check the sum, and read the free memory.
- :class:`FreeSpaceCheck`: the free space where checkpoints are staged and kept.
- :class:`StorageCheck`: write, read back and remove a probe in the run directory.
- :class:`CommandCheck`: a command; exit code 0 is healthy (whatever it left running
  is ended).
- :class:`CallableCheck`: a function; it fails by raising or returning False.

Example::

    results = run_checks([DeviceCheck("cuda", min_free_bytes=2**30),
                          FreeSpaceCheck(("/local/staging",), min_free_bytes=50 * 2**30),
                          CommandCheck(("nvidia-smi", "-q"))])
    bad = [r for r in results if not r.ok]   # each names the check and what it found
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any, Protocol

from elastic_train._internal.forked_call import call_in_child
from elastic_train._internal.process_identity import has_exited

DEFAULT_TIMEOUT_S = 60.0  # a context on each of 8 GPUs takes seconds; a hung driver never ends
MATMUL_SIZE = 128  # 128**3 = 2**21: the sum of a product of ones is exact in float32
OUTPUT_TAIL_BYTES = 2048  # what is read of a command's output: its last lines say why


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome: ``detail`` is what it found (why it failed, or what it read)."""

    name: str
    ok: bool
    detail: str
    seconds: float

    def __str__(self) -> str:
        return f"{self.name}: {'ok' if self.ok else 'FAILED'} ({self.detail}; {self.seconds:.2f}s)"


class HealthCheck(Protocol):
    """A check of this node: ``name`` for the record, ``check()`` raises what is wrong
    (its message is the detail) or returns what it found."""

    name: str

    def check(self) -> str: ...


def run_checks(checks: Sequence[HealthCheck]) -> list[CheckResult]:
    """Every check's result, in order; a check that raises has failed."""
    return [_timed(check) for check in checks]


def _timed(check: HealthCheck) -> CheckResult:
    start = time.monotonic()
    try:
        found, ok = check.check(), True
    except Exception as exc:  # noqa: BLE001 -- a failed check, whatever it raised
        found, ok = str(exc) or type(exc).__name__, False
    return CheckResult(check.name, ok, found, time.monotonic() - start)


class CheckFailed(Exception):
    """What a built-in check found wrong."""


@dataclass(frozen=True)
class DeviceCheck:
    """Each visible device of ``kind`` ("cuda", "xpu" or "cpu") creates its context,
    multiplies two matrices of ones (the sum must be exact) and, for accelerators, has
    at least ``min_free_bytes`` free. In a forked child: the agent is not touched. A node
    without such devices passes (nothing to check)."""

    kind: str = "cuda"
    min_free_bytes: int = 0
    timeout_s: float = DEFAULT_TIMEOUT_S
    name: str = "devices"

    def check(self) -> str:
        answer = call_in_child(lambda: _probe_devices(self.kind, self.min_free_bytes),
                               self.timeout_s)
        if not answer.ok:
            raise CheckFailed(f"the {self.kind} probe failed: {answer.error}")
        problems, found = answer.value
        if problems:
            raise CheckFailed("; ".join(problems))
        return found


def _probe_devices(kind: str, min_free_bytes: int) -> tuple[list[str], str]:
    """(problems, what was found) for every device of ``kind``; run in the child."""
    import torch

    if kind == "cpu":
        module, devices = None, [torch.device("cpu")]
    else:
        module = getattr(torch, kind)
        if not module.is_available():
            return [], f"no {kind} devices"
        devices = [torch.device(kind, i) for i in range(module.device_count())]
    problems, free = [], []
    expected = float(MATMUL_SIZE**3)
    for device in devices:
        ones = torch.ones(MATMUL_SIZE, MATMUL_SIZE, device=device)
        total = (ones @ ones).sum().item()  # .item() waits for the device
        if total != expected:
            problems.append(f"{device}: a {MATMUL_SIZE}x{MATMUL_SIZE} product of ones "
                            f"summed to {total:g}, not {expected:g}")
        if module is not None:
            available, _ = module.mem_get_info(device)
            free.append(f"{device} {available / 2**30:.1f} GiB free")
            if available < min_free_bytes:
                problems.append(f"{device}: {available / 2**30:.2f} GiB free, under the "
                                f"{min_free_bytes / 2**30:.2f} GiB asked")
    return problems, ", ".join(free) or f"{len(devices)} device(s) computed correctly"


@dataclass(frozen=True)
class FreeSpaceCheck:
    """Each of ``paths`` (the staging directory, the local tier) has at least
    ``min_free_bytes`` free on its file system."""

    paths: tuple[str, ...]
    min_free_bytes: int
    name: str = "free space"

    def check(self) -> str:
        found, short = [], []
        for path in self.paths:
            free = shutil.disk_usage(path).free
            found.append(f"{path} {free / 2**30:.1f} GiB free")
            if free < self.min_free_bytes:
                short.append(f"{path} has {free / 2**30:.2f} GiB free, under the "
                             f"{self.min_free_bytes / 2**30:.2f} GiB needed")
        if short:
            raise CheckFailed("; ".join(short))
        return ", ".join(found)


class _RoundTrip(Protocol):
    def round_trip(self) -> None: ...


@dataclass(frozen=True)
class StorageCheck:
    """The run directory takes a write, gives it back unchanged and lets it be removed
    (:meth:`elastic_train.storage.RunStorage.round_trip`)."""

    storage: _RoundTrip
    name: str = "storage"

    def check(self) -> str:
        self.storage.round_trip()
        return "a 4 KiB probe written, read back and removed"


@dataclass(frozen=True)
class CommandCheck:
    """The user's command: healthy when it exits 0 within ``timeout_s``; the end of its
    output says why not.

    It is judged by its exit code, not by the end of its output: a command that starts
    a daemon (``cmd &``) ends while the daemon still holds its output. It runs in a
    process group of its own, ended once it has exited or timed out, so that nothing
    it started outlives the check. Its output goes to unnamed temporary files, of which
    only the last :data:`OUTPUT_TAIL_BYTES` are read.
    """

    argv: tuple[str, ...]
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def name(self) -> str:
        return "command " + " ".join(self.argv)

    def check(self) -> str:
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                process = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out,
                                           stderr=err, start_new_session=True)
            except OSError as exc:
                raise CheckFailed(f"it could not start: {exc}") from None
            try:
                ended = _exited(process.pid, time.monotonic() + self.timeout_s)
            finally:  # its group while its pid is still held (not yet reaped): no other's
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            if not ended:
                raise CheckFailed(f"it did not end within {self.timeout_s:g}s")
            said = (_tail(err) or _tail(out)).splitlines()[-3:]
        if process.returncode != 0:
            raise CheckFailed(f"exit code {process.returncode}" + (
                ": " + " / ".join(said) if said else ""))
        return "exit code 0"


def _exited(pid: int, deadline: float) -> bool:
    """Waits until the child ``pid`` has exited, leaving it unreaped (its pid, and the
    group it leads, stay its own); False once ``deadline`` (monotonic) passed."""
    delay = 0.001
    while not has_exited(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    return True


def _tail(file: IO[bytes]) -> str:
    """The last :data:`OUTPUT_TAIL_BYTES` written to ``file``, stripped."""
    file.seek(max(0, file.seek(0, os.SEEK_END) - OUTPUT_TAIL_BYTES))
    return file.read().decode(errors="replace").strip()


@dataclass(frozen=True)
class CallableCheck:
    """The user's function, in a forked child: it fails by raising or by returning
    False; a string it returns is what it found."""

    fn: Callable[[], Any]
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def name(self) -> str:
        return getattr(self.fn, "__qualname__", None) or repr(self.fn)

    def check(self) -> str:
        answer = call_in_child(self.fn, self.timeout_s)
        if not answer.ok:
            raise CheckFailed(answer.error)
        if answer.value is False:
            raise CheckFailed("it returned False")
        return answer.value if isinstance(answer.value, str) else "passed"
