"""The framework-neutral trainer: validate, persist the spec, run the agent, collect the result.

``fit()`` reads top to bottom like the layers of the design: every setting is
checked in the driver before any process starts; the run directory is created
and ``run.json`` written; the node agent (torch.distributed.elastic) runs the
workers and restarts them within the failure budget; the result is read back
from storage, the source of truth.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from elastic_train._internal import pickling
from elastic_train._internal.ray_arguments import warn_ignored
from elastic_train._internal.redaction import redact_url
from elastic_train.agent.api import Interrupted
from elastic_train.callbacks import UserCallback
from elastic_train.checkpoint import Checkpoint
from elastic_train.config import RunConfig, ScalingConfig
from elastic_train.driver.node_run import FailureHints, NodePlan, NodeRun
from elastic_train.driver.resume_rules import TRAIN_FUNCTION_CHANGES, why_not_restorable
from elastic_train.errors import (
    ConfigError,
    StorageError,
)
from elastic_train.rendezvous_config import RendezvousConfig
from elastic_train.result import Result
from elastic_train.storage import RunStorage
from elastic_train.storage import filesystem as fsutil
from elastic_train.validation_config import ValidationConfig
from elastic_train.worker import user_code
from elastic_train.worker.backend import BackendConfig
from elastic_train.worker.fit_worker import FIT_WORKER, read_return_value
from elastic_train.worker.run_spec import RunSpec, check_train_function
from elastic_train.worker.worker_plan import GivenStorage

logger = logging.getLogger(__name__)


def _expect(value: Any, kind: type, name: str) -> Any:
    if value is not None and not isinstance(value, kind):
        raise ConfigError(f"{name}={value!r} must be a {kind.__name__} (or None).")
    return value


def _function_name(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _function_root(fn: Callable[..., Any]) -> tuple[str, ...]:
    """The directory of the train function's package (or module): the user's own code."""
    root = user_code.module_root(sys.modules.get(getattr(fn, "__module__", None) or ""))
    return (root,) if root else ()


def _signature(fn: Callable[..., Any]) -> str:
    """``"(config)"``, ``"(config, debug=)"``: the train function's parameters, without
    annotations or default values (editing those does not change how it is called)."""
    marks = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    params = inspect.signature(fn).parameters.values()
    return "(" + ", ".join(
        marks.get(p.kind, "") + p.name + ("=" if p.default is not p.empty else "")
        for p in params) + ")"


def _read_trainable(storage: RunStorage, stored: dict[str, Any], path: str) -> RunSpec:
    """The stored train function and settings; a module of them that cannot be imported
    here (a restore from another directory) is named, with where the run was started."""
    try:
        return storage.read_trainable()
    except ModuleNotFoundError as exc:
        started = stored.get("cwd")
        where = (f"run the restore from {started}, where the run was started" if started
                 else "run the restore from the directory the run was started in")
        raise ConfigError(
            f"Cannot restore {path!r}: its train function "
            f"({stored.get('train_function', '?')}) needs the module {exc.name!r}, which "
            f"cannot be imported from {os.getcwd()}: {where}, or add the module's directory "
            "to PYTHONPATH.") from None


def _storage_at(path: str | os.PathLike, filesystem: Any,
                options: dict[str, Any] | None) -> RunStorage:
    """The run directory at ``path``, reachable (see :meth:`RunStorage.check_reachable`)."""
    fs, run_path = fsutil.resolve(os.fspath(path), filesystem, options)
    storage = RunStorage(fs, run_path)
    storage.check_reachable()
    return storage


def _say_if_nothing_was_reported(result: Result) -> None:
    """A run whose train function never called report() has no metrics and no checkpoint:
    said once, since Ray users expect ``result.metrics`` to be filled."""
    if result.metrics is None and result.checkpoint is None:
        logger.warning("The run %s made no report(): Result.metrics and Result.checkpoint "
                       "are None. Call elastic_train.report(metrics, checkpoint=...) from the "
                       "train function, on every rank, to record them.", result.path)


def _refuse_inside_a_worker() -> None:
    """fit() in a worker of launch or torchrun would start a job per worker."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        raise ConfigError(
            "fit() was called inside a worker of `elastic-train launch` or torchrun "
            f"(TORCHELASTIC_RUN_ID={os.environ['TORCHELASTIC_RUN_ID']!r}): every worker "
            "would start a job of its own. Run the driver script itself on each node "
            "(`python train.py`, with ScalingConfig(num_workers_per_node=..., "
            "rendezvous=RendezvousConfig(...))), or give `elastic-train launch` a script "
            "that calls elastic_train.report() itself.")


def _trainer_arguments(spec: RunSpec) -> dict[str, Any]:
    """The keyword arguments every trainer takes, from a stored spec."""
    return {"train_loop_config": spec.train_loop_config, "scaling_config": spec.scaling_config,
            "run_config": spec.run_config, "datasets": spec.datasets,
            "resume_from_checkpoint": spec.resume_from_checkpoint, "metadata": spec.metadata,
            "validation_config": spec.validation_config}


class DataParallelTrainer:
    """Runs ``train_loop_per_worker`` on ``scaling_config.num_workers`` processes.

    Framework set-up comes from ``backend_config``; ``TorchTrainer`` is this
    trainer with a ``TorchConfig``.
    """

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        backend_config: BackendConfig,
        train_loop_config: dict[str, Any] | None = None,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        datasets: dict[str, Any] | None = None,
        resume_from_checkpoint: Checkpoint | None = None,
        metadata: dict[str, Any] | None = None,
        validation_config: ValidationConfig | None = None,
    ):
        check_train_function(train_loop_per_worker)
        self.train_loop_per_worker = train_loop_per_worker
        self.backend_config = backend_config
        self.train_loop_config = _expect(train_loop_config, dict, "train_loop_config")
        self.scaling_config = _expect(scaling_config, ScalingConfig, "scaling_config") \
            or ScalingConfig()
        self.run_config = _expect(run_config, RunConfig, "run_config") or RunConfig()
        self.datasets = dict(_expect(datasets, dict, "datasets") or {})
        self.resume_from_checkpoint = _expect(resume_from_checkpoint, Checkpoint,
                                              "resume_from_checkpoint")
        self.metadata = dict(_expect(metadata, dict, "metadata") or {})
        self.validation_config = _expect(validation_config, ValidationConfig,
                                         "validation_config")
        self._replaces_function = False  # set by restore() when given a new train function
        self._validate()

    @classmethod
    def _from_spec(cls, spec: RunSpec) -> DataParallelTrainer:
        return cls(spec.train_loop_per_worker, backend_config=spec.backend,
                   **_trainer_arguments(spec))

    @classmethod
    def restore(cls, path: str | os.PathLike, *,
                train_loop_per_worker: Callable[..., Any] | None = None,
                train_loop_config: dict[str, Any] | None = None,
                datasets: dict[str, Any] | None = None,
                storage_filesystem: Any = None,
                storage_options: dict[str, Any] | None = None) -> DataParallelTrainer:
        """A trainer that continues the run stored at ``path`` (Ray Train v1's API).

        Everything is read from the run directory; pass only what cannot be
        stored or must change: the train function or its config, the
        datasets, and the storage credentials (never stored).

        Example::

            if TorchTrainer.can_restore(path):
                result = TorchTrainer.restore(path).fit()
        """
        storage = _storage_at(path, storage_filesystem, storage_options)
        state = storage.read_run_state()
        why = why_not_restorable(state, state is not None and storage.has_trainable(),
                                 os.fspath(path))
        if why is not None:
            raise ConfigError(why)
        spec: RunSpec = _read_trainable(storage, state.spec, os.fspath(path))
        fs, run_path = storage.fs, storage.run_path
        if spec.resume_from_checkpoint is not None:  # stored without credentials
            spec.resume_from_checkpoint = spec.resume_from_checkpoint.rebound(fs)
        spec.run_config = dataclasses.replace(
            spec.run_config, name=run_path.rsplit("/", 1)[1],
            storage_path=fsutil.display_path(fs, run_path.rsplit("/", 1)[0]),
            storage_filesystem=storage_filesystem, storage_options=storage_options)
        if train_loop_per_worker is not None:
            spec.train_loop_per_worker = train_loop_per_worker
        if train_loop_config is not None:
            spec.train_loop_config = train_loop_config
        if datasets is not None:
            spec.datasets = datasets
        trainer = cls._from_spec(spec)
        trainer._replaces_function = train_loop_per_worker is not None
        return trainer

    @classmethod
    def can_restore(cls, path: str | os.PathLike, storage_filesystem: Any = None,
                    storage_options: dict[str, Any] | None = None) -> bool:
        """Whether ``path`` is a run that :meth:`restore` can continue: a run directory
        whose run did not finish. False for a finished run, another directory, or no path;
        also for a store that cannot be read, with a warning naming the cause."""
        try:
            storage = _storage_at(path, storage_filesystem, storage_options)
            state = storage.read_run_state()
        except (ConfigError, StorageError, OSError) as exc:
            logger.warning("can_restore(%r) is False: %s", os.fspath(path), exc)
            return False
        return state is not None and not state.is_finished and storage.has_trainable()

    def _validate(self) -> None:
        for callback in self.run_config.callbacks:
            if not isinstance(callback, UserCallback):
                raise ConfigError(f"RunConfig.callbacks has {callback!r}, which is not a "
                                  "UserCallback: subclass elastic_train.UserCallback.",
                                  field="RunConfig.callbacks")
        for name, dataset in self.datasets.items():
            if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
                raise ConfigError(f"datasets[{name!r}]={dataset!r} is not a map-style dataset: "
                                  "pass a torch Dataset with __len__ and __getitem__.")
            if len(dataset) < self.scaling_config.max_workers:
                raise ConfigError(f"datasets[{name!r}] has {len(dataset)} rows, fewer than "
                                  f"num_workers={self.scaling_config.num_workers}.")
        try:
            json.dumps(self.metadata)
        except TypeError as exc:
            raise ConfigError(f"metadata must be JSON-serialisable: {exc}") from exc
        self.backend_config.validate(self.scaling_config)
        if self.validation_config is not None:
            self.validation_config.check_devices(self.scaling_config)

    def _experiment_name(self) -> str:
        if self.run_config.name:
            return self.run_config.name
        if self.scaling_config.spans_nodes:  # every node must pick the same name
            return self.scaling_config.rendezvous.run_id
        return f"{type(self).__name__}_{time.strftime('%Y-%m-%d_%H-%M-%S')}"

    def fit(self) -> Result:
        """Runs the training to the end and returns its :class:`Result`.

        Across nodes (``ScalingConfig(num_workers_per_node=..., rendezvous=...)``)
        run the same script on every node: each ``fit()`` runs this node's
        agent, and the agents form one job. The node that is group rank 0 at
        the first rendezvous writes ``run.json`` (global rank 0, on it,
        commits the checkpoints); ``storage_path`` must be shared by all
        nodes (NFS, S3). Every node's ``fit()`` returns the same
        :class:`Result`, read from storage; ``return_value`` is set on the
        node that ran rank 0 only.

        Raises:
            TrainingFailedError: the workers failed more than ``max_failures`` times.
            KeyboardInterrupt: Ctrl-C; every worker is stopped and the run is
                left resumable (status ``interrupted``).
        """
        _refuse_inside_a_worker()
        run = self.run_config
        warn_ignored(self, self.scaling_config, run, run.failure_config, run.checkpoint_config,
                     self.validation_config)
        name = self._experiment_name()
        run_config = dataclasses.replace(self.run_config, name=name)
        start = self.resume_from_checkpoint
        if start is not None and not start.filesystem.exists(start.path):
            raise ConfigError(f"resume_from_checkpoint={start!r} does not exist: pass the "
                              "directory of a saved checkpoint, e.g. result.checkpoint.")
        # What is written (run.json, trainable.pkl, the scratch spec.pkl) holds the storage
        # URL without its password; the workers get the URL as given in their environment.
        stored_config = dataclasses.replace(run_config,
                                            storage_path=redact_url(run_config.storage_path))
        spec = RunSpec(
            train_loop_per_worker=self.train_loop_per_worker,
            train_loop_config=self.train_loop_config, backend=self.backend_config,
            scaling_config=self.scaling_config,
            run_config=dataclasses.replace(stored_config, callbacks=[]),  # driver-side only
            experiment_name=name, datasets=self.datasets,
            resume_from_checkpoint=start, metadata=self.metadata,
            validation_config=self.validation_config,
        )
        pickled = self._pickle(spec)
        plan = NodePlan(
            storage=RunStorage.for_run(run_config, name), run_config=run_config,
            scaling=self.scaling_config,
            rendezvous=self.scaling_config.rendezvous or RendezvousConfig.single_node(name),
            spec=self._describe(stored_config), hints=FailureHints.for_fit(),
            accepted=TRAIN_FUNCTION_CHANGES if self._replaces_function else frozenset(),
            trainable=self._trainable(spec, stored_config),
            train_loop_config=self.train_loop_config,
            user_code=_function_root(self.train_loop_per_worker))
        with NodeRun(plan) as node:
            return_value = self._run_node(node, pickled)
        result = Result.from_storage(plan.storage, return_value=return_value)
        _say_if_nothing_was_reported(result)
        return result

    def _run_node(self, node: NodeRun, pickled_spec: bytes) -> Any:
        """This node's workers, each running ``python -m elastic_train.worker.fit_worker
        SPEC SCRATCH``; returns what rank 0's train function returned (on its node)."""
        spec_path = os.path.join(node.scratch, "spec.pkl")
        with open(spec_path, "wb") as f:
            f.write(pickled_spec)
        scaling = self.scaling_config
        env = {"OMP_NUM_THREADS": str(scaling.threads_per_worker(scaling.workers_per_node)),
               **self.run_config.worker_env_vars}
        storage_path = node.plan.run_config.storage_path
        if redact_url(storage_path) != storage_path:  # the spec holds it redacted
            env.update(GivenStorage(storage_path).env())
        try:
            node.run(sys.executable, ("-m", FIT_WORKER, spec_path, node.scratch), env)
        except Interrupted as exc:
            logger.warning("Run interrupted by %s; it can be resumed by running fit() again "
                           "with RunConfig(name=%r).", signal.Signals(exc.signum).name,
                           node.plan.run_config.name)
            signal.raise_signal(exc.signum)  # the caller's own handler decides what happens
            raise KeyboardInterrupt from None
        return read_return_value(node.scratch)

    def _trainable(self, spec: RunSpec, run_config: RunConfig) -> bytes:
        """The spec ``restore(path)`` reads: without what must never be stored
        (credentials, and the workers' environment variables, which may hold some), and
        without ``start_over``, which applies to this launch only."""
        start = self.resume_from_checkpoint
        return self._pickle(dataclasses.replace(
            spec, scaling_config=self.scaling_config.without_secrets(),
            run_config=dataclasses.replace(run_config, storage_filesystem=None,
                                           storage_options=None, start_over=False,
                                           worker_runtime_env=None),
            resume_from_checkpoint=start and start.without_credentials()))

    @staticmethod
    def _pickle(spec: RunSpec) -> bytes:
        try:
            return pickling.dumps(spec)
        except Exception as exc:
            raise ConfigError(
                "The train function, its config, the datasets or the validation function "
                f"cannot be pickled ({exc!r}); "
                "workers receive them pickled. Move unpicklable objects (locks, open files, "
                "clients) into the train function."
            ) from exc

    def _describe(self, run_config: RunConfig) -> dict[str, Any]:
        """The spec recorded in run.json (no credentials)."""
        return {
            "trainer": type(self).__name__,
            "train_function": _function_name(self.train_loop_per_worker),
            "train_signature": _signature(self.train_loop_per_worker),
            "scaling_config": asdict(self.scaling_config.without_secrets()),
            "failure_config": asdict(run_config.failure_config),
            "checkpoint_config": asdict(run_config.checkpoint_config),
            "storage_path": run_config.storage_path,
            "backend": repr(self.backend_config),
            "cwd": os.getcwd(),  # where its modules were found, for a restore elsewhere
        }
