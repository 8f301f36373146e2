"""MLflow: ``MLflowLoggerCallback`` (driver) and ``setup_mlflow()`` (train function).

Mirrors ``ray.air.integrations.mlflow``. Needs ``mlflow`` or ``mlflow-skinny``
(``pip install 'elastic-train[mlflow]'``).

Example::

    from elastic_train.integrations.mlflow import MLflowLoggerCallback

    RunConfig(callbacks=[MLflowLoggerCallback(tracking_uri="sqlite:///mlflow.db",
                                              experiment_name="digits")])
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from types import ModuleType
from typing import Any

from elastic_train.callbacks import RunContext, UserCallback
from elastic_train.checkpoint import Checkpoint
from elastic_train.integrations.common import (
    checkpoint_files,
    flatten,
    metric_values,
    run_outcome,
)
from elastic_train.integrations.extras import require
from elastic_train.worker.session import current_session, get_context

logger = logging.getLogger(__name__)

RUN_TAG = "elastic_train.run"  # the run directory an MLflow run belongs to
STATUS = {"finished": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}
PARAM_LIMIT = 6000  # characters MLflow keeps of a parameter value


def _mlflow(user: str) -> ModuleType:
    return require("mlflow", extra="mlflow", user=user, package="mlflow-skinny")


def _connect(mlflow: ModuleType, tracking_uri: str | None, registry_uri: str | None,
             tracking_token: str | None) -> None:
    if tracking_token:
        os.environ["MLFLOW_TRACKING_TOKEN"] = tracking_token  # how MLflow takes a token
    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    if registry_uri:
        mlflow.set_registry_uri(registry_uri)


def _experiment_id(client: Any, experiment_id: str | None, name: str | None,
                   create: bool) -> str:
    """An existing experiment by id or name, or a new one named ``name`` if ``create``."""
    if experiment_id and client.get_experiment(experiment_id) is not None:
        return experiment_id
    found = client.get_experiment_by_name(name) if name else None
    if found is not None:
        return found.experiment_id
    if create and name:
        return client.create_experiment(name)
    raise ValueError(
        f"MLflow experiment id={experiment_id!r} name={name!r} does not exist at "
        f"{client.tracking_uri}: create it first, or pass create_experiment_if_not_exists=True.")


def _params(config: dict[str, Any] | None) -> dict[str, str]:
    return {k: str(v)[:PARAM_LIMIT] for k, v in flatten(config or {}).items()}


class MLflowLoggerCallback(UserCallback):
    """Logs the run to MLflow from the driver (Ray's name and arguments).

    One MLflow run per elastic-train run, tagged with its directory: every
    reported row becomes metrics at step ``training_iteration``, the
    ``train_loop_config`` becomes params, and the run ends ``FINISHED``,
    ``FAILED`` or ``KILLED`` (interrupted). A run continued later (``fit()``
    again, ``restore``) logs into the same MLflow run.

    Args:
        tracking_uri: Where MLflow stores runs (default: ``MLFLOW_TRACKING_URI``,
            else MLflow's default). With several nodes, use a server that the
            driver of group rank 0 can reach.
        registry_uri: MLflow's model registry URI.
        experiment_name: The experiment, created if missing (default:
            ``MLFLOW_EXPERIMENT_NAME``, else the run's name).
        tags: Tags of the MLflow run.
        tracking_token: Token for a remote tracking server.
        save_artifact: At the end, log ``run.json``, ``metrics.jsonl`` and the
            latest committed checkpoint (under ``checkpoint/``) as artifacts.
            Ray logs the whole trial directory; ours also holds every kept
            checkpoint and the workers' logs.
        log_params_on_trial_end: Log the params when the run ends instead of
            when it starts (Ray's name).
    """

    def __init__(self, tracking_uri: str | None = None, *, registry_uri: str | None = None,
                 experiment_name: str | None = None, tags: dict[str, Any] | None = None,
                 tracking_token: str | None = None, save_artifact: bool = False,
                 log_params_on_trial_end: bool = False):
        self._mlflow = _mlflow("MLflowLoggerCallback")
        self.tracking_uri = tracking_uri
        self.registry_uri = registry_uri
        self.experiment_name = experiment_name
        self.tags = dict(tags or {})
        self.tracking_token = tracking_token
        self.save_artifact = save_artifact
        self.log_params_on_trial_end = log_params_on_trial_end
        self._client: Any = None
        self._run_id: str | None = None
        self._failed = False

    def _start(self, run_context: RunContext) -> str:
        if self._run_id is not None:
            return self._run_id
        _connect(self._mlflow, self.tracking_uri, self.registry_uri, self.tracking_token)
        self._client = self._mlflow.tracking.MlflowClient()
        name = (self.experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME")
                or run_context.run_name)
        experiment = _experiment_id(self._client, None, name, create=True)
        path = run_context.run_path
        earlier = self._client.search_runs(
            [experiment], filter_string=f"tags.`{RUN_TAG}` = '{path}'", max_results=1)
        if earlier:
            self._run_id = earlier[0].info.run_id
            self._client.update_run(self._run_id, status="RUNNING")
        else:
            tags = {**{k: str(v) for k, v in self.tags.items()}, RUN_TAG: path,
                    "mlflow.runName": run_context.run_name}
            self._run_id = self._client.create_run(experiment, tags=tags,
                                                   run_name=run_context.run_name).info.run_id
            if not self.log_params_on_trial_end:
                self._log_params(run_context)
        return self._run_id

    def _log_params(self, run_context: RunContext) -> None:
        from mlflow.entities import Param

        params = [Param(k, v) for k, v in _params(run_context.train_loop_config).items()]
        if params:
            self._client.log_batch(self._run_id, params=params)

    def after_report(self, run_context: RunContext, metrics: list[dict[str, Any]],
                     checkpoint: Checkpoint | None) -> None:
        from mlflow.entities import Metric

        run_id = self._start(run_context)
        row = metrics[0]
        step = int(row.get("training_iteration", 0))
        stamp = int(float(row.get("timestamp", 0)) * 1000)
        values = [Metric(k, v, stamp, step) for k, v in metric_values(row).items()]
        if values:
            self._client.log_batch(run_id, metrics=values)

    def after_exception(self, run_context: RunContext,
                        worker_exceptions: dict[int, Exception]) -> None:
        self._failed = True

    def after_run(self, run_context: RunContext) -> None:
        run_id = self._start(run_context)
        if self.log_params_on_trial_end:
            self._log_params(run_context)
        if self.save_artifact:
            self._save_artifacts(run_context, run_id)
        outcome = run_outcome(run_context, self._failed)
        self._client.set_terminated(run_id, status=STATUS[outcome])

    def _save_artifacts(self, run_context: RunContext, run_id: str) -> None:
        storage = run_context.storage
        with tempfile.TemporaryDirectory(prefix="elastic_train_mlflow_") as directory:
            source = f"{storage.run_path}/run.json"
            if storage.fs.exists(source):
                storage.fs.get_file(source, os.path.join(directory, "run.json"))
            rows = storage.read_metrics()  # one file, whatever the store's layout
            if rows:
                with open(os.path.join(directory, "metrics.jsonl"), "w") as f:
                    f.writelines(json.dumps(row) + "\n" for row in rows)
            self._client.log_artifacts(run_id, directory)
        committed = storage.checkpoints.committed()
        if committed:
            latest = Checkpoint(storage.checkpoints.path(committed[-1].index), storage.fs)
            with checkpoint_files(latest) as local:
                self._client.log_artifacts(run_id, local, artifact_path="checkpoint")


class _Noop:
    """What ``setup_mlflow`` returns on ranks that do not log: every call does nothing."""

    def __getattr__(self, name: str) -> _Noop:
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None


def setup_mlflow(config: dict[str, Any] | None = None, tracking_uri: str | None = None,
                 registry_uri: str | None = None, experiment_id: str | None = None,
                 experiment_name: str | None = None, tracking_token: str | None = None,
                 artifact_location: str | None = None, run_name: str | None = None,
                 create_experiment_if_not_exists: bool = False,
                 tags: dict[str, Any] | None = None, rank_zero_only: bool = True) -> Any:
    """Starts an MLflow run in the train function and returns the ``mlflow`` module
    (Ray's name and arguments).

    On ranks other than 0 it returns an object whose every call does nothing,
    unless ``rank_zero_only=False``. ``config`` is logged as the run's params.
    The experiment is ``experiment_id``, else ``experiment_name`` (default:
    ``MLFLOW_EXPERIMENT_ID`` / ``MLFLOW_EXPERIMENT_NAME``, else the run's
    name); it must exist unless ``create_experiment_if_not_exists=True``
    (then it is created, with ``artifact_location``).

    Example::

        def train_func(config):
            mlflow = setup_mlflow(config, experiment_name="digits",
                                  create_experiment_if_not_exists=True)
            ...
            mlflow.log_metrics({"loss": loss}, step=epoch)
    """
    mlflow = _mlflow("setup_mlflow")
    in_session = current_session() is not None
    if in_session and rank_zero_only and get_context().get_world_rank() != 0:
        return _Noop()
    run = get_context().get_experiment_name() if in_session else None
    _connect(mlflow, tracking_uri, registry_uri, tracking_token)
    client = mlflow.tracking.MlflowClient()
    name = experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME") or run
    experiment = experiment_id or os.environ.get("MLFLOW_EXPERIMENT_ID")
    if create_experiment_if_not_exists and name and artifact_location \
            and client.get_experiment_by_name(name) is None:
        client.create_experiment(name, artifact_location=artifact_location)
    experiment = _experiment_id(client, experiment, name, create_experiment_if_not_exists)
    mlflow.start_run(experiment_id=experiment, run_name=run_name or run,
                     tags={k: str(v) for k, v in (tags or {}).items()} or None)
    params = _params({k: v for k, v in (config or {}).items() if k != "mlflow"})
    if params:
        mlflow.log_params(params)
    return mlflow
