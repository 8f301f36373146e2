"""A worker of ``fit()``: ``python -m elastic_train.worker.fit_worker SPEC_PATH RESULT_DIR``.

Started by the agent with torch.distributed.elastic's environment. It joins
the process group, runs the user's train function inside a session, waits
for pending checkpoint uploads and, on rank 0, saves the function's return
value for the driver.
"""

from __future__ import annotations

import os
import sys

import cloudpickle
from fsspec.implementations.local import LocalFileSystem

from elastic_train.context import WorkerEnv
from elastic_train.storage import filesystem as fsutil
from elastic_train.worker.lifecycle import run_worker
from elastic_train.worker.run_spec import RunSpec
from elastic_train.worker.session import TrainSession, init_session, shutdown_session
from elastic_train.worker.storage_access import open_run_storage

FIT_WORKER = "elastic_train.worker.fit_worker"  # this module, as the agent runs it
RETURN_VALUE_FILE = "return_value.pkl"


def read_return_value(result_dir: str) -> object:
    """In the driver, after the run: what rank 0's train function returned, else None."""
    path = os.path.join(result_dir, RETURN_VALUE_FILE)
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        return cloudpickle.load(f)


def run(spec_path: str, result_dir: str) -> None:
    env = WorkerEnv.from_environ()
    with open(spec_path, "rb") as f:
        spec: RunSpec = cloudpickle.load(f)
    storage = open_run_storage(spec.run_config, spec.experiment_name)
    resources = spec.backend.on_worker_start(env, spec.scaling_config)
    staging = os.path.join(result_dir, "staging")
    session = TrainSession(spec, env, resources, storage, staging)
    init_session(session)
    value = spec.call_train_function()
    session.finish()
    if env.rank == 0:
        fsutil.write_bytes_atomic(LocalFileSystem(), os.path.join(result_dir, RETURN_VALUE_FILE),
                                  cloudpickle.dumps(value))
    shutdown_session()
    spec.backend.on_worker_shutdown()


def main(argv: list[str]) -> None:
    run_worker(lambda: run(*argv))


if __name__ == "__main__":
    main(sys.argv[1:])
