"""A worker of ``fit()``: ``python -m elastic_train.worker.fit_worker SPEC_PATH RESULT_DIR``.

Started by the agent with torch.distributed.elastic's environment. It joins
the process group, runs the user's train function inside a session, waits
for pending checkpoint uploads and, on rank 0, saves the function's return
value for the driver. With in-process restarts (:mod:`.inprocess.loop`) a failed
attempt is followed by another in the same process: process group, session
and train function again.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace

import cloudpickle

from elastic_train._internal import pickling
from elastic_train.context import WorkerEnv
from elastic_train.storage import filesystem as fsutil
from elastic_train.worker.inprocess import group_sockets
from elastic_train.worker.inprocess import loop as inprocess
from elastic_train.worker.lifecycle import run_worker
from elastic_train.worker.run_spec import RunSpec
from elastic_train.worker.session import (
    TrainSession,
    current_session,
    init_session,
    shutdown_session,
)
from elastic_train.worker.storage_access import open_run_storage
from elastic_train.worker.worker_plan import GivenStorage

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
    with open(spec_path, "rb") as f:
        spec: RunSpec = cloudpickle.load(f)
    given = GivenStorage.load()
    if given is not None:  # the URL with its password, never written
        spec.run_config = replace(spec.run_config, storage_path=given.path)
    storage = open_run_storage(spec.run_config, spec.experiment_name)
    staging = os.path.join(result_dir, "staging")

    def attempt() -> object:
        env = WorkerEnv.from_environ()
        with group_sockets.recording():  # cut if the attempt fails (see group_sockets)
            resources = spec.backend.on_worker_start(env, spec.scaling_config)
        session = TrainSession(spec, env, resources, storage, staging)
        init_session(session)
        value = spec.call_train_function()
        session.returned()
        session.finish()
        return value

    def release(finish_s: float) -> None:
        session = current_session()
        if session is not None:
            session.end_failed_attempt(finish_s)
        shutdown_session()
        spec.backend.on_worker_shutdown()

    value = inprocess.run_attempts(attempt, release) if inprocess.enabled() else attempt()
    if WorkerEnv.from_environ().rank == 0:
        fsutil.write_local_atomic(os.path.join(result_dir, RETURN_VALUE_FILE),
                                  pickling.dumps(value))
    shutdown_session()
    spec.backend.on_worker_shutdown()


def main(argv: list[str]) -> None:
    run_worker(lambda: run(*argv))


if __name__ == "__main__":
    main(sys.argv[1:])
