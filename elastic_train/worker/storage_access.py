"""The run directory as a worker opens it: its writes fenced by the job's lease.

The driver holds the run's lease (:mod:`elastic_train.driver.run_lease`) and gives
the workers its token (``ELASTIC_TRAIN_LEASE_TOKEN``); rank 0's commits, retention
and cleanups, and every rank's uploads, are refused once a newer job took the run
over (:meth:`~elastic_train.storage.RunStorage.use_fence`).
"""

from __future__ import annotations

import os

from elastic_train import env_vars
from elastic_train.config import RunConfig
from elastic_train.storage import RunStorage


def open_run_storage(run_config: RunConfig, name: str) -> RunStorage:
    """The run directory ``run_config`` names, fenced by the lease token in the environment
    (unfenced without one, e.g. outside a driver's workers)."""
    storage = RunStorage.for_run(run_config, name)
    token = os.environ.get(env_vars.LEASE_TOKEN)
    storage.use_fence(int(token) if token else None)
    return storage
