"""The driver the layout tests run under each Python layout (tests/support/python_layouts.py).

    python layout_driver.py fit STORAGE RUNS
    python layout_driver.py launch ARG...   (``elastic-train launch ARG...``)
    python layout_driver.py fit-broken-fork STORAGE RUNS   (the forked zygote fails)

``fit``: RUNS runs of ``fit()`` in this process, each with one rank SIGKILLed once, and
the worker zygote closed between them, so that every run forks a new one from this
process. Both modes print a line ``LAYOUT {json}`` (where torch was found, the prefixes),
and one ``ZYGOTE {json}`` line per run (whether the zygote was forked from this process;
with ``fit``, the failures the run recorded).

The check of whether this process may be forked is told yes: the driver has run no
parallel torch operation, and the tests must see the zygote forked from it (the case
where the user's modules are dropped), not a fresh interpreter because a loaded machine
was slow to answer that check.
"""

import json
import os
import signal
import sys
import tempfile

import torch

import elastic_train as et
from elastic_train.agent.zygote import fork as zygote_fork
from elastic_train.agent.zygote import server as zygote
from elastic_train.torch import TorchTrainer

# The fork trial's name: main's since #23 (None: fork), and before it (True: fork).
for _trial, _fork in (("_fork_trial", None), ("_parallel_op_survives_fork", True)):
    if hasattr(zygote_fork, _trial):
        setattr(zygote_fork, _trial, lambda *args, _fork=_fork, **kwargs: _fork)


def train(config):
    rank = et.get_context().get_world_rank()
    start = 0 if et.get_checkpoint() is None else 1
    for epoch in range(start, 3):
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None
            if rank == 0:
                torch.save({"epoch": epoch}, os.path.join(d, "state.pt"))
                checkpoint = et.Checkpoint.from_directory(d)
            et.report({"epoch": epoch}, checkpoint=checkpoint, checkpoint_upload_mode="SYNC")
        if start == 0 and epoch == 0 and rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)


def forked() -> bool:
    return isinstance(zygote._zygote._proc, zygote_fork.ForkedZygote) and \
        zygote._zygote._proc.poll() is None


def fit(storage: str, runs: int) -> None:
    for i in range(runs):
        zygote._zygote.close()
        name = f"run{i}"
        TorchTrainer(train, scaling_config=et.ScalingConfig(num_workers=2),
                     run_config=et.RunConfig(storage_path=storage, name=name,
                                             failure_config=et.FailureConfig(max_failures=3))
                     ).fit()
        with open(os.path.join(storage, name, "run.json")) as f:
            state = json.load(f)
        print("ZYGOTE", json.dumps({"forked": forked(), "failures": len(state["failures"]),
                                    "zygote_errors": state.get("zygote_errors", [])}),
              flush=True)


if __name__ == "__main__":
    print("LAYOUT", json.dumps({"torch": torch.__file__, "prefix": sys.prefix,
                                "base_prefix": sys.base_prefix}), flush=True)
    if sys.argv[1] == "fit-broken-fork":  # a forked zygote that dies as it sheds the driver
        def broken(*args, **kwargs):
            raise RuntimeError("injected: the zygote cannot shed the driver")

        zygote_fork._forget_user_modules = broken
    if sys.argv[1].startswith("fit"):
        fit(sys.argv[2], int(sys.argv[3]))
    else:
        from elastic_train.cli.main import main

        code = main(["launch", *sys.argv[2:]])
        print("ZYGOTE", json.dumps({"forked": forked()}), flush=True)
        sys.exit(code)
