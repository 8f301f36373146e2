"""Train functions that end the way users' mistakes do, for the tests of what users are told.

``config["how"]``: ``raise`` (a ValueError), ``exit3`` (``sys.exit(3)``) or ``os_exit``
(``os._exit(1)``), by rank 1; ``config["after_report"]``: after the first report()
rather than before it. Rank 0 waits in a barrier meanwhile, as a survivor does.
"""

from __future__ import annotations

import os
import sys

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
        os._exit(1)
    dist.barrier()
    et.report({"step": 2})


def report_own_iteration(config: dict) -> None:
    """Reports a metric named as a field report() fills in itself, twice."""
    for step in (100, 200):
        et.report({"training_iteration": step, "loss": 1.0})
