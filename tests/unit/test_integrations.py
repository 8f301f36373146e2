"""Unit tests of the integration modules: no processes (the e2e tests run them for real)."""

from __future__ import annotations

import sys

import pytest

from elastic_train.errors import ConfigError
from elastic_train.integrations.common import flatten, metric_values
from elastic_train.integrations.extras import require


def test_require_names_the_extra_of_a_missing_package():
    with pytest.raises(ImportError, match=r"pip install 'elastic-train\[mlflow\]'.*mlflow-skinny"):
        require("no_such_package_here", extra="mlflow", user="X", package="mlflow-skinny")


def test_require_passes_on_a_missing_dependency_of_an_installed_package(tmp_path, monkeypatch):
    (tmp_path / "pkg_needing_more").mkdir()
    (tmp_path / "pkg_needing_more" / "__init__.py").write_text("import dependency_not_here\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="dependency_not_here") as info:
        require("pkg_needing_more", extra="x", user="X")
    assert "elastic-train[x]" not in str(info.value)  # the package is there: say what is not


def test_flatten_and_metric_values():
    row = {"loss": 0.5, "ok": True, "name": "a", "nested": {"acc": 1, "deep": {"x": 2.0}},
           "nan": float("nan"), "pid": 7, "training_iteration": 3}
    assert flatten({"a": {"b": {"c": 1}}, "d": 2}) == {"a/b/c": 1, "d": 2}
    assert metric_values(row) == {"loss": 0.5, "nested/acc": 1.0, "nested/deep/x": 2.0,
                                  "training_iteration": 3.0}


@pytest.fixture
def only_pytorch_lightning(monkeypatch):
    """As in a script that imported ``pytorch_lightning`` (``lightning`` installed too)."""
    pl = pytest.importorskip("pytorch_lightning")
    for name in list(sys.modules):
        if name == "lightning" or name.startswith("lightning."):
            monkeypatch.delitem(sys.modules, name)
    return pl


def test_classes_bind_to_the_lightning_package_the_script_uses(only_pytorch_lightning):
    pl = only_pytorch_lightning
    from elastic_train.lightning import RayDDPStrategy, RayLightningEnvironment

    strategy = RayDDPStrategy(find_unused_parameters=True)
    assert isinstance(strategy, RayDDPStrategy)
    assert isinstance(strategy, pl.strategies.DDPStrategy)
    assert isinstance(RayLightningEnvironment(),
                      pl.plugins.environments.LightningEnvironment)

    class Mine(RayDDPStrategy):  # a user's subclass binds the same way
        pass

    assert isinstance(Mine(), pl.strategies.DDPStrategy) and isinstance(Mine(), Mine)


def test_lightning_pytorch_is_used_when_the_script_imported_it():
    lightning = pytest.importorskip("lightning.pytorch")
    from elastic_train.lightning import RayTrainReportCallback

    assert isinstance(RayTrainReportCallback(), lightning.callbacks.Callback)
    assert RayTrainReportCallback.CHECKPOINT_NAME == "checkpoint.ckpt"


def test_deepspeed_strategy_without_deepspeed_says_how_to_get_it(monkeypatch):
    pytest.importorskip("pytorch_lightning")
    import importlib.util

    from elastic_train.lightning import RayDeepSpeedStrategy

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "deepspeed" else real(name, *a))
    with pytest.raises(ImportError, match="pip install deepspeed"):
        RayDeepSpeedStrategy()


def test_prepare_trainer_refuses_lightnings_own_strategy(only_pytorch_lightning):
    pl = only_pytorch_lightning
    from elastic_train.lightning import prepare_trainer

    trainer = pl.Trainer(strategy=pl.strategies.DDPStrategy(), accelerator="cpu", devices=1,
                         logger=False, enable_checkpointing=False)
    with pytest.raises(ConfigError, match="RayDDPStrategy"):
        prepare_trainer(trainer)


def test_wandb_callback_needs_a_project_and_a_key_unless_offline(monkeypatch):
    pytest.importorskip("wandb")
    from elastic_train.integrations.wandb import WandbLoggerCallback

    for name in ("WANDB_PROJECT_NAME", "WANDB_PROJECT", "WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", "/nonexistent")
    with pytest.raises(ConfigError, match="project"):
        WandbLoggerCallback()
    with pytest.raises(ConfigError, match="WANDB_MODE=offline"):
        WandbLoggerCallback(project="p")
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert WandbLoggerCallback(project="p").project == "p"


def test_setup_mlflow_outside_a_run_needs_an_existing_experiment(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from elastic_train.integrations.mlflow import setup_mlflow

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    with pytest.raises(ValueError, match="create_experiment_if_not_exists=True"):
        setup_mlflow({"lr": 1}, tracking_uri=uri, experiment_name="missing")
    mlflow = setup_mlflow({"lr": 1}, tracking_uri=uri, experiment_name="made",
                          create_experiment_if_not_exists=True)
    try:
        assert mlflow.get_run(mlflow.active_run().info.run_id).data.params == {"lr": "1"}
    finally:
        mlflow.end_run()


@pytest.mark.parametrize("status, failed, outcome", [
    ("failed", False, "failed"), ("interrupted", False, "interrupted"),
    ("finished", False, "finished"), ("running", True, "failed")])
def test_run_outcome_reads_the_runs_status(tmp_path, status, failed, outcome):
    """What a tracker records as the run's end: run.json's status, or the driver's word."""
    from elastic_train.callbacks import RunContext
    from elastic_train.integrations.common import run_outcome
    from elastic_train.storage import RunStorage
    from elastic_train.storage.run_state import RunState, RunStatus

    storage = RunStorage.open(str(tmp_path), "run")
    storage.write_run_state(RunState(name="run", status=RunStatus(status)))
    assert run_outcome(RunContext("run", storage), failed) == outcome
