"""Workers that record whether torch marked them a bad fork (their CUDA would not start).

With torch's CUDA build this shows on a CPU machine too: a process forked after its parent
asked the CUDA runtime for devices has ``torch.cuda._is_in_bad_fork()`` True, and on a GPU
its first CUDA call fails with ``Cannot re-initialize CUDA in forked subprocess``.
"""

from __future__ import annotations

import os
import signal
import time

import torch

import elastic_train as et


def ticks_since_boot() -> int:
    """Now, in the clock ticks of /proc/PID/stat's start times."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def started(pid: int | str = "self") -> int:
    """When process ``pid`` started, in clock ticks since boot."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def record(out_dir: str) -> None:
    """Writes ``rank-R-attempt-A-pid-P`` holding ``bad`` or ``clean``, and
    ``started-rank-R-attempt-A``: when this process started."""
    rank = os.environ["RANK"]
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    with open(os.path.join(out_dir, f"rank-{rank}-attempt-{attempt}-pid-{os.getpid()}"),
              "w") as f:
        f.write("bad" if torch.cuda._is_in_bad_fork() else "clean")
    with open(os.path.join(out_dir, f"started-rank-{rank}-attempt-{attempt}"), "w") as f:
        f.write(str(started()))


def train(config: dict) -> None:
    """Records, then (once, on ``kill_rank``'s first attempt) dies by SIGKILL, so that a
    replacement worker is forked and records too. The ``killed`` marker holds when."""
    record(config["out"])
    ctx = et.get_context()
    et.report({"attempt": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))})
    marker = os.path.join(config["out"], "killed")
    if ctx.get_world_rank() == config.get("kill_rank") and not os.path.exists(marker):
        time.sleep(config.get("kill_after_s", 0))  # mid-training, not as the group starts
        with open(marker, "w") as f:
            f.write(str(ticks_since_boot()))
        os.kill(os.getpid(), signal.SIGKILL)
