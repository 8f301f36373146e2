"""A driver whose Ctrl-C comes at a chosen moment of its start-up, as a user's can.

Usage: python -m tests.e2e.scripts.ctrl_c_driver STORAGE NAME MOMENT [GRACE_S]

It runs ``fit()`` of :func:`tests.support.message_jobs.report_slowly` (a minute of
reports) in the session the test started it in, and at ``MOMENT`` sends SIGINT to that
session's process group once, as the terminal does at a Ctrl-C:

- ``fork-trial``: in the throw-away child that tries whether the driver may be forked;
- ``zygote``: in the zygote just forked from the driver, before it left the session;
- ``worker``: in a worker just forked by the zygote, before it has its own session;
- ``start``: in the driver itself, after the rendezvous, as its agent starts the workers.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import elastic_train as et
from elastic_train.agent import local_agent
from elastic_train.agent.zygote import fork, server
from elastic_train.torch import TorchTrainer
from tests.support import message_jobs

SLOW_S = 0.5
GROUP = os.getpgrp()  # the terminal's foreground group: this driver's session


def ctrl_c_first(function):
    """``function``, with one Ctrl-C to :data:`GROUP` before it, the first time this
    process or one forked from here calls it (a file created exclusively says which)."""
    marker = os.path.join(sys.argv[1], "ctrl-c-sent")

    def wrapped(*args, **kwargs):
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return function(*args, **kwargs)
        os.killpg(GROUP, signal.SIGINT)
        time.sleep(SLOW_S)  # a child slow to start, as on a loaded machine
        return function(*args, **kwargs)
    return wrapped


MOMENTS = {"start": (local_agent.TrainAgent, "_start_workers"),
           "fork-trial": (fork, "poisoned_fork"), "zygote": (fork, "_shed_the_driver"),
           "worker": (server._Server, "close_in_child")}

if __name__ == "__main__":
    storage, name, moment = sys.argv[1:4]
    grace = float(sys.argv[4]) if len(sys.argv) > 4 else 25.0
    os.makedirs(storage, exist_ok=True)
    module, attribute = MOMENTS[moment]
    setattr(module, attribute, ctrl_c_first(getattr(module, attribute)))
    TorchTrainer(message_jobs.report_slowly, scaling_config=et.ScalingConfig(num_workers=2),
                 run_config=et.RunConfig(
                     storage_path=storage, name=name,
                     failure_config=et.FailureConfig(preemption_grace_s=grace))).fit()
