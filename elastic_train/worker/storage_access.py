"""The run directory as a worker opens it: its writes fenced by the job's lease.

The driver holds the run's lease (:mod:`elastic_train.driver.run_lease`) and gives
the workers its token (in the worker plan); rank 0's commits, retention
and cleanups, and every rank's uploads, are refused once a newer job took the run
over (:meth:`~elastic_train.storage.RunStorage.use_fence`).
"""

from __future__ import annotations

from elastic_train.config import RunConfig
from elastic_train.storage import RunStorage
from elastic_train.worker.worker_plan import WorkerPlan


def open_run_storage(run_config: RunConfig, name: str) -> RunStorage:
    """The run directory ``run_config`` names, fenced by the lease token of the worker
    plan (unfenced without one, e.g. outside a driver's workers)."""
    storage = RunStorage.for_run(run_config, name)
    plan = WorkerPlan.load()
    storage.use_fence(plan.lease_token if plan is not None else None)
    return storage
