"""Running one variant as a subprocess tree: timing, memory sampling, fault injection.

The launched command gets its own session (``start_new_session=True``). Its
descendants are found through /proc (torch's agent starts every worker in a
session of its own, so a process group does not reach them); on a timeout or
at the end every process of that tree -- and only those -- is killed by pid.

While the command runs, the harness samples ``VmHWM`` (peak resident set
size) of the launched process and of each descendant, and the sum of their
PSS (proportional set size: shared pages split between their sharers). An optional
``on_poll`` callback (figure 4) can act on the run, e.g. SIGKILL a worker, and
can stop it early by returning a reason (e.g. "no recovery within 60 s").

It also measures how much CPU *other* processes on the machine used during
the run (all cores' busy time from /proc/stat minus the CPU time of this
harness and of the run's process tree), since a 2-core machine shared with
anything else makes small differences unmeasurable.
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

POLL_S = 0.02
MEMORY_EVERY_S = 0.2


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def descendants(root: int) -> list[int]:
    """Live descendants of ``root`` (children, grandchildren, ...), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if fields is None or fields[0] == "Z":
            continue
        parents.setdefault(int(fields[1]), []).append(int(entry))
    out: list[int] = []
    todo = [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def machine_busy_s() -> float:
    """CPU seconds that all cores together have been busy since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:9]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    """CPU seconds of this process and of every descendant reaped so far.

    A run's whole tree is counted once its root is reaped: each parent (the
    agent) reaps its children (the workers), so their time adds up to the root's.
    """
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def _kib_field(path: str, key: str) -> float | None:
    """The ``key:  N kB`` line of a /proc file in MiB, or None once the process is gone."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def peak_rss_mb(pid: int) -> float | None:
    """``VmHWM`` of a live process in MiB (its peak RSS so far), or None once gone."""
    return _kib_field(f"/proc/{pid}/status", "VmHWM")


def pss_mb(pid: int) -> float | None:
    """A live process's proportional set size in MiB (pages shared by N processes count
    1/N each, so the sum over a tree is what the tree really holds), or None once gone."""
    return _kib_field(f"/proc/{pid}/smaps_rollup", "Pss")
    return None


@dataclass
class RunResult:
    """What the harness saw of one run (times are ``time.time()``)."""

    root_pid: int
    launched: float
    ended: float
    returncode: int | None
    timed_out: bool
    output_tail: str
    stopped: str = ""  # why an on_poll callback stopped the run early
    foreign_cores: float | None = None  # mean CPU use of other processes, in cores
    peak_rss_mb: dict[int, float] = field(default_factory=dict)  # pid -> VmHWM
    peak_pss_total_mb: float = 0.0  # the largest sum of PSS over the tree at one sample
    marks: dict[str, float] = field(default_factory=dict)  # set by on_poll callbacks

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.stopped


def start_ticks(pid: int) -> str | None:
    """The kernel's start time of ``pid``: with the pid, it names one process for good."""
    fields = _stat_fields(pid)
    return None if fields is None else fields[19]


def _kill_tree(root: int, known: dict[int, str | None]) -> None:
    """SIGKILLs ``root``'s session and every process of its tree we have seen.

    A pid seen earlier is killed only if it still names the same process (same
    start time): an exited worker's pid may have been reused by a stranger.
    """
    pids = dict(known)
    pids.update({pid: start_ticks(pid) for pid in descendants(root)})
    try:
        os.killpg(root, signal.SIGKILL)  # root is not reaped yet: the group id is ours
    except ProcessLookupError:
        pass
    for pid, ticks in pids.items():
        if ticks is None or start_ticks(pid) != ticks:
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def kill_tree(root: int) -> None:
    """SIGKILLs what is left of a process tree started in a session of its own."""
    _kill_tree(root, {})


def free_port() -> int:
    """A port nothing on 127.0.0.1 listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


PollCallback = Callable[[RunResult], str | None]


def _sample_memory(tree: list[int], result: RunResult) -> None:
    """Raises ``result``'s peaks to the memory ``tree``'s processes use now."""
    for pid in tree:
        rss = peak_rss_mb(pid)
        if rss is not None:
            result.peak_rss_mb[pid] = max(rss, result.peak_rss_mb.get(pid, 0))
    total = sum(p for pid in tree if (p := pss_mb(pid)) is not None)
    result.peak_pss_total_mb = max(result.peak_pss_total_mb, total)


def run(cmd: list[str], env: dict[str, str], cwd: str, timeout_s: float, log_path: str,
        on_poll: PollCallback | None = None, memory: bool = True) -> RunResult:
    """Runs ``cmd`` to the end (or ``timeout_s``) and returns what was measured.

    stdout and stderr go to ``log_path``; the last lines come back in the result.
    ``memory=False`` leaves out the peak memory: reading every process's
    ``smaps_rollup`` five times a second took half a core beside workers that map
    gigabytes, CPU time that figures of training speed must not lose.
    """
    with open(log_path, "wb") as log:
        busy0, own0 = machine_busy_s(), own_cpu_s()
        launched = time.time()
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        result = RunResult(root_pid=proc.pid, launched=launched, ended=0.0, returncode=None,
                           timed_out=False, output_tail="")
        seen: dict[int, str | None] = {}
        next_sample = 0.0
        try:
            while True:
                code = proc.poll()
                now = time.time()
                if code is not None:
                    result.ended, result.returncode = now, code
                    break
                if now - launched > timeout_s:
                    result.timed_out = True
                    break
                if now >= next_sample:
                    tree = [proc.pid] + descendants(proc.pid)
                    seen.update({pid: start_ticks(pid) for pid in tree if pid not in seen})
                    if memory:
                        _sample_memory(tree, result)
                    next_sample = now + MEMORY_EVERY_S
                if on_poll is not None and (reason := on_poll(result)):
                    result.stopped = reason
                    break
                time.sleep(POLL_S)
        finally:
            _kill_tree(proc.pid, seen)
            proc.wait()
            if result.ended == 0.0:
                result.ended = time.time()
            wall = time.time() - launched
            foreign = (machine_busy_s() - busy0) - (own_cpu_s() - own0)
            result.foreign_cores = max(0.0, foreign / wall) if wall > 0 else None
    with open(log_path, "rb") as f:
        f.seek(max(0, os.path.getsize(log_path) - 4000))
        result.output_tail = f.read().decode(errors="replace")
    return result
