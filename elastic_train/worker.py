"""A worker process: ``python -m elastic_train.worker SPEC_PATH RESULT_DIR``.

Started by the agent with torch.distributed.elastic's environment. It dies
with its agent (``PR_SET_PDEATHSIG``), joins the process group, runs the
user's train function inside a session and, on rank 0, saves the function's
return value. Errors are written to torch's error file (``record``), which is
how the driver gets this worker's traceback.
"""

from __future__ import annotations

import ctypes
import faulthandler
import json
import logging
import os
import signal
import sys
import time
import traceback
from types import TracebackType

import cloudpickle
from fsspec.implementations.local import LocalFileSystem

from elastic_train.context import AGENT_PID_ENV, WorkerEnv
from elastic_train.run_spec import RunSpec
from elastic_train.session import TrainSession, init_session, shutdown_session
from elastic_train.storage import RunStorage
from elastic_train.storage import filesystem as fsutil

RETURN_VALUE_FILE = "return_value.pkl"
_PR_SET_PDEATHSIG = 1


def die_with_agent() -> None:
    """Asks the kernel to SIGKILL this process when the agent dies, so no worker is orphaned."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    agent_pid = os.environ.get(AGENT_PID_ENV)
    if agent_pid is not None and os.getppid() != int(agent_pid):
        os._exit(1)  # the agent died before the request took effect


def run(spec_path: str, result_dir: str) -> None:
    env = WorkerEnv.from_environ()
    with open(spec_path, "rb") as f:
        spec: RunSpec = cloudpickle.load(f)
    storage = RunStorage.for_run(spec.run_config, spec.experiment_name)
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


def write_error_file(exc: BaseException) -> None:
    """Writes the error for the agent in torch.distributed.elastic's error-file format.

    Atomically: the agent may read the file the moment this process exits or
    a peer fails, and torch's own writer can leave it half-written then.
    """
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {"message": {
        "message": f"{type(exc).__name__}: {exc}",
        "extraInfo": {"py_callstack": "".join(traceback.format_exception(exc)),
                      "timestamp": str(int(time.time()))},
    }}
    fsutil.write_bytes_atomic(LocalFileSystem(), path, json.dumps(data).encode())


def _user_frames(tb: TracebackType | None) -> TracebackType | None:
    """Drops the leading frames of this package, so the traceback starts in user code."""
    package = os.path.dirname(os.path.abspath(__file__))
    first = tb
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(package + os.sep):
        tb = tb.tb_next
    return tb or first


def main(argv: list[str]) -> None:
    """Runs the worker; on error, records the traceback for the agent and exits at once.

    A failed worker does not tear down its process group: peers may be blocked
    in a collective with it, and the agent stops the whole group anyway.
    """
    die_with_agent()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    faulthandler.enable()
    try:
        run(*argv)
    except BaseException as exc:  # noqa: BLE001 -- every error must reach the driver
        exc.__traceback__ = _user_frames(exc.__traceback__)
        write_error_file(exc)
        traceback.print_exc()
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
