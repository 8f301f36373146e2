"""Train functions that end the way users' mistakes do, for the tests of what users are told.

``config["how"]``: ``raise`` (a ValueError), ``exit3`` (``sys.exit(3)``), ``sleep`` (a
hang in ``time.sleep``) or ``os_exit``
(``os._exit(1)``), by rank 1; ``config["after_report"]``: after the first report()
rather than before it. Rank 0 waits in a barrier meanwhile, as a survivor does.
"""

from __future__ import annotations

import os
import sys
import time

import torch.distributed as dist

import elastic_train as et


def fail(config: dict) -> None:
    if config.get("after_report"):
        et.report({"step": 1})
    if et.get_context().get_world_rank() == 1:
        how = config["how"]
        if how == "raise":
            raise ValueError("a mistake in the train function")
        if how == "exit3":
            sys.exit(3)
        if how == "sleep":
            time.sleep(600)
        os._exit(1)
    dist.barrier()
    et.report({"step": 2})


def fill_the_disk(config: dict) -> None:
    """Reports a checkpoint a step; rank 0 fills ``config["fs"]`` (a
    :class:`tests.support.full_disk.FullDiskFS`) after the second."""
    import tempfile

    from tests.support.full_disk import fill

    for step in range(20):
        if step == 2 and et.get_context().get_world_rank() == 0:
            fill(config["fs"])
        with tempfile.TemporaryDirectory() as directory:
            with open(os.path.join(directory, "weights.txt"), "w") as f:
                f.write(str(step))
            et.report({"step": step}, checkpoint=et.Checkpoint.from_directory(directory))


def report_own_iteration(config: dict) -> None:
    """Reports a metric named as a field report() fills in itself, twice."""
    for step in (100, 200):
        et.report({"training_iteration": step, "loss": 1.0})


def report_slowly(config: dict) -> None:
    """Reports every 0.2 s for up to a minute (to be stopped with Ctrl-C)."""
    import time

    for step in range(300):
        et.report({"step": step})
        time.sleep(0.2)


if __name__ == "__main__":  # a driver: fit() of report_slowly at STORAGE_PATH NAME
    from elastic_train.torch import TorchTrainer

    TorchTrainer(report_slowly, scaling_config=et.ScalingConfig(num_workers=2),
                 run_config=et.RunConfig(storage_path=sys.argv[1], name=sys.argv[2])).fit()
