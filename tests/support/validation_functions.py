"""Validation functions the unit tests hand to :class:`~elastic_train.ValidationConfig`,
in a module of their own so that a validation process, or a process a test starts to run
a validation runner, imports them by name."""

from __future__ import annotations

import subprocess
import sys
import time


def starts_processes(checkpoint, pid_file, sleep_s):
    """A validation function that starts a process in its own session (as a nested
    trainer's zygote does), one in its own group, notes their pids, then sleeps."""
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    children = [subprocess.Popen(sleeper, start_new_session=True), subprocess.Popen(sleeper)]
    with open(pid_file, "w") as f:
        f.write(" ".join(str(c.pid) for c in children))
    time.sleep(sleep_s)
    return {"val": 1.0}
