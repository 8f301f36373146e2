"""Rank 0's asynchronous validations: ``ValidationConfig.fn`` on committed checkpoints,
off the training path.

Once rank 0's committer has committed a checkpoint reported with ``validation=``, it
hands the manifest here. A thread of rank 0's worker takes the checkpoints one at a
time (Ray's ``MAX_IN_FLIGHT_VALIDATIONS = 1``; the others queue, in order) and runs
each in a process of its own (:mod:`.validation_process`: a new interpreter, not a
worker slot of the training, holding no GIL and no CUDA context the training needs),
waiting for it up to the task's ``timeout_s``. Training goes on meanwhile: no rank
waits for a validation, except ``get_all_reported_checkpoints(VALIDATED)`` and the end
of the run (``fit()`` returns once every validation asked for is done, as Ray's
controller waits for them before it shuts down).

Outcomes, as Ray's (the committer records them in the checkpoint's manifest and row):

- the function returns a dict: ``VALIDATED``, its metrics merged into the row;
- it raises, returns something else, or its process dies: ``VALIDATION_FAILED``, with
  the traceback logged on rank 0 and kept in the manifest; training goes on;
- it outlives ``timeout_s``: its process is killed, ``VALIDATION_TIMEOUT``.

However it ends, every process the validation started dies with it (its process and
their descendants, found through ``/proc`` and stopped before they are killed, and
whatever is left in the session it leads: see
:func:`~elastic_train._internal.process_identity.end_tree`): a nested trainer's agent, zygote
and workers included. ``timeout_s=None`` (the default, Ray's) sets no limit: the end
of the run waits for the validation as long as it runs, as Ray's controller does.

When an attempt fails, the validation running is killed and the queue dropped; the
checkpoints stay ``PENDING_VALIDATION`` in their manifests, and the next attempt's
rank 0 validates them again (:meth:`ValidationRunner.requeue`, as Ray requeues
incomplete validations on resumption).

Example::

    runner = ValidationRunner(config, store, committer.finish_validation, scratch, devices)
    runner.submit(manifest)     # from the commit, on rank 0's upload thread
    runner.close()              # at the end of the run: waits for the queue
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from elastic_train._internal import pickling, process_identity
from elastic_train.checkpoint import Checkpoint
from elastic_train.worker import heartbeat
from elastic_train.worker.validation_process import VALIDATION_PROCESS

if TYPE_CHECKING:
    from elastic_train.storage import CheckpointStore, CommitManifest
    from elastic_train.validation_config import ValidationConfig

logger = logging.getLogger(__name__)

_POLL_S = 0.05
_WAITING_LOG_S = 60.0  # how often the end of the run says which validation it waits for


@dataclass(frozen=True)
class Outcome:
    """How one validation ended: Ray's status name, the metrics (VALIDATED only) and,
    otherwise, why."""

    status: str
    metrics: dict[str, Any]
    error: str = ""


class _Abandoned(Exception):
    """The attempt ended while a validation ran."""


class ValidationRunner:
    """Runs rank 0's validations, one at a time, each in a process of its own.

    ``done(manifest, outcome)`` is called on the runner's thread when one ends (the
    committer's :meth:`~elastic_train.worker.committer.Committer.finish_validation`).
    """

    def __init__(self, config: ValidationConfig, store: CheckpointStore,
                 done: Callable[[CommitManifest, Outcome], None], scratch_dir: str,
                 devices: Sequence[Any] = ()):
        self._config = config
        self._env = _child_environment(config, devices)
        self._store = store
        self._done = done
        self._scratch = scratch_dir
        self._queue: queue.Queue[CommitManifest | None] = queue.Queue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._running: tuple[str, float, float | None] | None = None  # name, start, timeout_s

    def submit(self, manifest: CommitManifest) -> None:
        """Queues the validation of the committed checkpoint ``manifest`` (its task in
        ``manifest.validation``); none once abandoned (it stays pending)."""
        if self._stop.is_set():
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="validations",
                                            daemon=True)
            self._thread.start()
        self._queue.put(manifest)

    def requeue(self, manifests: list[CommitManifest]) -> None:
        """Queues the checkpoints an earlier attempt left ``PENDING_VALIDATION``."""
        for manifest in manifests:
            logger.info("Validating %s again: its validation had not ended when the "
                        "previous attempt stopped.", manifest.name)
            self.submit(manifest)

    def close(self) -> None:
        """Waits until every queued validation has ended (the end of the run). Training
        is over then, so the wait counts as this rank's progress for the agent's hang
        watch (``FailureConfig.hang_timeout_s``); during training it never does.

        As Ray's controller does, it waits for a validation without ``timeout_s`` for as
        long as it runs, saying each :data:`_WAITING_LOG_S` which one it waits for. An
        interrupted run (Ctrl-C, a scheduler's SIGTERM) kills it with everything it
        started, and a restore validates the checkpoint again."""
        if self._thread is not None:
            self._queue.put(None)
            said = time.monotonic()
            while self._thread.is_alive():
                if time.monotonic() - said >= _WAITING_LOG_S:
                    said = time.monotonic()
                    self._say_waiting()
                self._thread.join(1.0)
                heartbeat.beat()
            self._thread = None

    def _say_waiting(self) -> None:
        if (running := self._running) is None:
            return
        name, started, timeout_s = running
        logger.warning("The run ends once the validation of %s has ended (running for %.0f s; "
                       "%s). Ctrl-C ends it now; fit() again validates it again.", name,
                       time.monotonic() - started, "no timeout_s: waited for as long as it "
                       "runs, as Ray waits" if timeout_s is None else f"timeout_s={timeout_s:g}")

    def abandon(self) -> None:
        """Kills the validation running and drops the queue (a failed attempt): the
        checkpoints stay pending, for the next attempt."""
        self._stop.set()
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        while (manifest := self._queue.get()) is not None and not self._stop.is_set():
            try:
                outcome = self.run(manifest)
            except _Abandoned:
                return
            try:
                self._done(manifest, outcome)
            except Exception:  # a storage error must not end the thread: log, go on
                logger.exception("Could not record the validation of %s", manifest.name)

    def run(self, manifest: CommitManifest) -> Outcome:
        """Validates one checkpoint in a process of its own and says how it ended."""
        task = manifest.validation["task"]
        timeout_s = task.get("timeout_s")
        payload = pickling.dumps({
            "fn": self._config.fn,
            "checkpoint": Checkpoint(self._store.path(manifest.index), self._store.fs),
            "fn_kwargs": task.get("fn_kwargs") or {}})
        os.makedirs(self._scratch, exist_ok=True)
        fd, result_path = tempfile.mkstemp(prefix="validation-", suffix=".json",
                                           dir=self._scratch)
        os.close(fd)
        os.unlink(result_path)  # the process writes it atomically when it ends
        logger.info("Validating %s in the background.", manifest.name)
        started = time.monotonic()
        self._running = (manifest.name, started, timeout_s)
        process = subprocess.Popen(
            [sys.executable, "-m", VALIDATION_PROCESS, result_path, str(os.getpid())],
            stdin=subprocess.PIPE, env=self._env, start_new_session=True)
        try:
            if not self._finish(process, payload,
                                None if timeout_s is None else started + timeout_s):
                logger.error("Validation of %s exceeded timeout_s=%s s: its process, and "
                             "every process it started, was killed; the checkpoint's status "
                             "is VALIDATION_TIMEOUT.", manifest.name, timeout_s)
                return Outcome("VALIDATION_TIMEOUT", {},
                               f"exceeded timeout_s={timeout_s} s")
            return _read_outcome(manifest.name, result_path, process.returncode)
        finally:
            self._running = None
            if os.path.exists(result_path):
                os.unlink(result_path)

    def _finish(self, process: subprocess.Popen, payload: bytes,
                deadline: float | None) -> bool:
        """Hands ``process`` its payload and waits for it (:meth:`_wait`); then it is
        reaped, killed first with every process it started when it is still running
        (the deadline passed, or the attempt ended), and what it started is killed
        when it ended alone: a validation leaves nothing behind."""
        try:
            assert process.stdin is not None
            try:
                process.stdin.write(payload)
                process.stdin.close()
            except BrokenPipeError:  # it died at start; its exit code tells
                pass
            return self._wait(process, deadline)
        finally:
            process_identity.end_tree(process.pid)
            process.wait()

    def _wait(self, process: subprocess.Popen, deadline: float | None) -> bool:
        """Waits for ``process`` to exit (left unreaped, see
        :func:`~elastic_train._internal.process_identity.has_exited`); False once ``deadline``
        passed. :class:`_Abandoned` when the attempt ends meanwhile."""
        while not process_identity.has_exited(process.pid):
            if self._stop.is_set():
                raise _Abandoned
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S)
        return True


def _read_outcome(name: str, result_path: str, returncode: int) -> Outcome:
    try:
        with open(result_path) as f:
            result = json.load(f)
    except (OSError, ValueError):
        result = {"error": f"its process ended with exit code {returncode} before it "
                           "returned (killed, or out of memory?)"}
    if "metrics" in result:
        return Outcome("VALIDATED", result["metrics"])
    logger.error("Validation of %s failed; training goes on and the checkpoint's status "
                 "is VALIDATION_FAILED:\n%s", name, result["error"])
    return Outcome("VALIDATION_FAILED", {}, result["error"])


# torch.distributed.elastic's description of a worker's place in the job: the validation
# process holds none (a validation function may start a TorchTrainer of its own, as Ray's
# guide's distributed validation does, and fit() refuses to run inside a worker).
_WORKER_PLACE = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE",
                 "MASTER_ADDR", "MASTER_PORT")


def _child_environment(config: ValidationConfig, devices: Sequence[Any]) -> dict[str, str]:
    """The worker's environment less its place in the job, its ``sys.path`` as
    ``PYTHONPATH`` (the validation function's module imports in the new interpreter as it
    did here), with the ``env_vars`` of ``ray_remote_kwargs``' ``runtime_env``; its GPUs
    are the worker's, or, with ``ray_remote_kwargs={"num_gpus": n}``, the first ``n`` of
    ``devices`` (rank 0's) only, as Ray's task would see just the GPUs it was given."""
    env = {k: v for k, v in os.environ.items()
           if k not in _WORKER_PLACE and not k.startswith("TORCHELASTIC_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p) or os.getcwd()
    env.update(config.env_vars)
    if config.num_gpus:
        env["CUDA_VISIBLE_DEVICES"] = visible_devices(devices, config.num_gpus,
                                                      env.get("CUDA_VISIBLE_DEVICES"))
    return env


def visible_devices(devices: Sequence[Any], count: float, visible: str | None) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a process given the first ``count`` (rounded up) of the
    CUDA ``devices`` (``torch.device("cuda", i)``), numbered as in ``visible`` (the
    worker's own ``CUDA_VISIBLE_DEVICES``; None: all of the node's)."""
    indices = [d.index for d in devices if d.type == "cuda"][:math.ceil(count)]
    names = visible.split(",") if visible else None
    return ",".join(names[i] if names else str(i) for i in indices)
