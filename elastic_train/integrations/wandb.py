"""Weights & Biases: ``WandbLoggerCallback`` (driver) and ``setup_wandb()`` (train function).

Mirrors ``ray.air.integrations.wandb``. Needs ``wandb`` (``pip install
'elastic-train[wandb]'``). With ``WANDB_MODE=offline`` nothing is sent and no
API key is needed: runs are written under ``WANDB_DIR`` for a later ``wandb sync``.

Example::

    from elastic_train.integrations.wandb import WandbLoggerCallback

    RunConfig(callbacks=[WandbLoggerCallback(project="digits")])
"""

from __future__ import annotations

import hashlib
import os
from types import ModuleType
from typing import Any

from elastic_train.callbacks import RunContext, UserCallback
from elastic_train.checkpoint import Checkpoint
from elastic_train.errors import ConfigError
from elastic_train.integrations.common import (
    checkpoint_files,
    flatten,
    metric_values,
    run_outcome,
)
from elastic_train.integrations.extras import require
from elastic_train.worker.session import current_session, get_context

PROJECT_ENV = "WANDB_PROJECT_NAME"  # Ray's variables (wandb itself reads WANDB_PROJECT)
GROUP_ENV = "WANDB_GROUP_NAME"
OFFLINE_MODES = ("offline", "disabled", "dryrun")
EXIT_CODES = {"finished": 0, "failed": 1, "interrupted": 130}


def _wandb(user: str) -> ModuleType:
    return require("wandb", extra="wandb", user=user)


def _set_api_key(api_key_file: str | None, api_key: str | None) -> None:
    """Puts the key where wandb reads it (``WANDB_API_KEY``), as Ray does; offline
    runs need none. Raises ConfigError when no key can be found."""
    if api_key_file and api_key:
        raise ConfigError("W&B: pass api_key or api_key_file, not both.")
    if api_key_file:
        with open(os.path.expanduser(api_key_file)) as f:
            api_key = f.readline().strip()
    if api_key:
        os.environ["WANDB_API_KEY"] = api_key
        return
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_MODE") in OFFLINE_MODES:
        return
    netrc = os.path.expanduser("~/.netrc")
    if os.path.exists(netrc) and "api.wandb.ai" in open(netrc).read():
        return  # `wandb login` stored one
    raise ConfigError("W&B: no API key. Set WANDB_API_KEY, pass api_key= or api_key_file=, "
                      "run `wandb login`, or log offline with WANDB_MODE=offline.")


def _run_id(run_path: str, logger: str) -> str:
    """A W&B run id per run directory and logger (``driver``: the callback, ``workers``:
    setup_wandb), so that a continued run logs into the same W&B run."""
    return hashlib.sha1(f"{run_path}#{logger}".encode()).hexdigest()[:16]


class WandbLoggerCallback(UserCallback):
    """Logs the run to W&B from the driver (Ray's name and arguments).

    One W&B run per elastic-train run (its id derived from the run directory,
    so a run continued later resumes it): the ``train_loop_config`` as its
    config, every reported row as a ``log`` (charted against
    ``training_iteration``), and the exit code at the end (0 finished, 1
    failed, 130 interrupted).

    Args:
        project: The W&B project (default: ``WANDB_PROJECT_NAME``, as in Ray,
            else ``WANDB_PROJECT``); required.
        group: The W&B group (default: ``WANDB_GROUP_NAME``, else the run's name).
        api_key_file / api_key: The API key, unless ``WANDB_API_KEY`` is set,
            ``wandb login`` was run or ``WANDB_MODE=offline``.
        excludes: Metrics not to log.
        log_config: Also log a ``config`` entry of reported rows (Ray's flag).
        upload_checkpoints: Log each checkpoint as a W&B artifact (callbacks get a
            checkpoint once it is committed; one deleted by retention since is skipped).
        save_checkpoints: Ray's older name of ``upload_checkpoints``.
        upload_timeout: Accepted for Ray scripts: Ray waits this long for its
            logging process; here ``finish()`` runs in the driver and returns
            when W&B has written (or, online, sent) everything.
        **kwargs: More arguments for ``wandb.init()``.
    """

    # Row fields that describe the run rather than measure it: W&B config, not logs.
    AUTO_CONFIG_KEYS = ("hostname", "pid", "date")
    _EXCLUDE = ("timestamp", "checkpoint_dir_name", "done", "should_checkpoint")

    def __init__(self, project: str | None = None, group: str | None = None,
                 api_key_file: str | None = None, api_key: str | None = None,
                 excludes: list[str] | None = None, log_config: bool = False,
                 upload_checkpoints: bool = False, save_checkpoints: bool = False,
                 upload_timeout: int = 1800, **kwargs: Any):
        self._wandb = _wandb("WandbLoggerCallback")
        self.project = project or os.environ.get(PROJECT_ENV) or os.environ.get("WANDB_PROJECT")
        if not self.project:
            raise ConfigError(f"WandbLoggerCallback(project=None): name the W&B project, e.g. "
                              f"WandbLoggerCallback(project='digits'), or set {PROJECT_ENV}.")
        _set_api_key(api_key_file, api_key)
        self.group = group or os.environ.get(GROUP_ENV)
        self.excludes = list(excludes or [])
        self.log_config = log_config
        self.upload_checkpoints = upload_checkpoints or save_checkpoints
        self.upload_timeout = upload_timeout
        self.kwargs = kwargs
        self._run: Any = None
        self._failed = False

    def _start(self, run_context: RunContext) -> Any:
        if self._run is None:
            init = {"project": self.project, "group": self.group or run_context.run_name,
                    "name": run_context.run_name, "id": _run_id(run_context.run_path, "driver"),
                    "resume": "allow", "config": flatten(run_context.train_loop_config or {}),
                    "reinit": "create_new", **self.kwargs}
            self._run = self._wandb.init(**init)
            self._run.define_metric("*", step_metric="training_iteration")
        return self._run

    def after_report(self, run_context: RunContext, metrics: list[dict[str, Any]],
                     checkpoint: Checkpoint | None) -> None:
        run = self._start(run_context)
        row = metrics[0]
        info = {k: row[k] for k in self.AUTO_CONFIG_KEYS if k in row}
        if info:
            run.config.update(info, allow_val_change=True)
        skip = (*self._EXCLUDE, *self.AUTO_CONFIG_KEYS, *self.excludes,
                *(() if self.log_config else ("config",)))
        run.log({k: v for k, v in metric_values(row, exclude=()).items()
                 if not any(k == s or k.startswith(s + "/") for s in skip)})
        if checkpoint is not None and self.upload_checkpoints:
            self._upload(run_context, checkpoint)

    def _upload(self, run_context: RunContext, checkpoint: Checkpoint) -> None:
        """Logs a (committed) checkpoint as an artifact, unless retention deleted it since."""
        name = checkpoint.path.rstrip("/").rsplit("/", 1)[-1]
        if run_context.storage.checkpoints.is_committed(name):
            artifact = self._wandb.Artifact(f"checkpoint_{self._run.id}", type="model")
            with checkpoint_files(checkpoint) as local:
                artifact.add_dir(local)
                self._run.log_artifact(artifact)

    def after_exception(self, run_context: RunContext,
                        worker_exceptions: dict[int, Exception]) -> None:
        self._failed = True

    def after_run(self, run_context: RunContext) -> None:
        run = self._start(run_context)
        run.finish(exit_code=EXIT_CODES[run_outcome(run_context, self._failed)])
        self._run = None
        if self._wandb.run is None:  # no run of the user's: stop the service wandb started
            self._wandb.teardown()


def setup_wandb(config: dict[str, Any] | None = None, api_key: str | None = None,
                api_key_file: str | None = None, rank_zero_only: bool = True,
                **kwargs: Any) -> Any:
    """Starts a W&B run in the train function and returns it (Ray's name and arguments).

    On ranks other than 0 it returns a disabled run (every call does nothing),
    unless ``rank_zero_only=False``. ``config`` becomes the run's config; the
    run is named and grouped after the elastic-train run, and its id is derived
    from the run directory so that a restarted group logs into the same run.
    ``kwargs`` go to ``wandb.init()`` and win over these defaults.

    Example::

        def train_func(config):
            run = setup_wandb(config, project="digits")
            ...
            run.log({"loss": loss})
    """
    wandb = _wandb("setup_wandb")
    in_session = current_session() is not None
    if in_session and rank_zero_only and get_context().get_world_rank() != 0:
        return wandb.init(mode="disabled")
    _set_api_key(api_key_file, api_key)
    init: dict[str, Any] = {"config": {k: v for k, v in (config or {}).items() if k != "wandb"},
                            "project": os.environ.get(PROJECT_ENV) or None,
                            "group": os.environ.get(GROUP_ENV) or None}
    if in_session:
        context = get_context()
        name = context.get_experiment_name()
        init.update(name=name, group=init["group"] or name, resume="allow",
                    id=_run_id(context.get_storage().experiment_fs_path, "workers"))
    init.update(kwargs)
    return wandb.init(**{k: v for k, v in init.items() if v is not None})
