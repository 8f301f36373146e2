"""MLflow and W&B runs hold what a real 2-worker run reported: the driver-side
callbacks (MLflowLoggerCallback, WandbLoggerCallback) and setup_mlflow() /
setup_wandb() in the workers, read back from MLflow's file store and W&B's
offline run files."""

from __future__ import annotations

import cloudpickle
import pytest
import torch
from torch.utils.data import TensorDataset

import elastic_train as et
from elastic_train.torch import TorchTrainer
from tests.support import tracking_job
from tests.support.wandb_offline import read_offline_runs

mlflow = pytest.importorskip("mlflow")
pytest.importorskip("wandb")
cloudpickle.register_pickle_by_value(tracking_job)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240),
              pytest.mark.usefixtures("no_leaked_processes")]

EPOCHS = 3


def test_mlflow_and_wandb_runs_hold_the_metrics(tmp_path, monkeypatch):
    from elastic_train.integrations.mlflow import RUN_TAG, MLflowLoggerCallback
    from elastic_train.integrations.wandb import WandbLoggerCallback

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3.10+: opt in to files
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    (tmp_path / "wandb").mkdir()
    uri = (tmp_path / "mlruns").as_uri()
    config = {"epochs": EPOCHS, "lr": 0.05, "mlflow_uri": uri, "model": {"width": 8},
              "rows_per_rank": 5}
    result = TorchTrainer(
        tracking_job.train, train_loop_config=config,
        datasets={"train": TensorDataset(torch.arange(10.0))},
        scaling_config=et.ScalingConfig(num_workers=2),
        run_config=et.RunConfig(
            storage_path=str(tmp_path / "results"), name="tracked",
            callbacks=[MLflowLoggerCallback(tracking_uri=uri, experiment_name="driver",
                                            tags={"team": "e2e"}, save_artifact=True),
                       WandbLoggerCallback(project="e2e", upload_checkpoints=True)]),
    ).fit()

    client = mlflow.tracking.MlflowClient(uri)
    [run] = client.search_runs([client.get_experiment_by_name("driver").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags[RUN_TAG] == result.path
    assert run.data.tags["team"] == "e2e" and run.data.params["model/width"] == "8"
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(i + 1, 1 / (i + 1)) for i in range(EPOCHS)]
    assert [m.value for m in client.get_metric_history(run.info.run_id, "nested/epoch")] \
        == list(range(EPOCHS))
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"run.json", "metrics.jsonl", "checkpoint"} <= artifacts
    assert [a.path for a in client.list_artifacts(run.info.run_id, "checkpoint")] \
        == ["checkpoint/state.pt"]
    [worker_run] = client.search_runs([client.get_experiment_by_name("workers").experiment_id])
    assert worker_run.data.params["epochs"] == str(EPOCHS)  # config logged as params
    assert len(client.get_metric_history(worker_run.info.run_id, "worker_loss")) == EPOCHS

    runs = read_offline_runs(str(tmp_path / "wandb"))
    driver = [r for r in runs.values() if "training_iteration" in str(r.history)]
    assert len(driver) == 1 and len(runs) == 2, runs
    rows = [h for h in driver[0].history if "loss" in h]
    assert [h["loss"] for h in rows] == [1 / (i + 1) for i in range(EPOCHS)]
    assert [h["training_iteration"] for h in rows] == list(range(1, EPOCHS + 1))
    assert driver[0].config["model/width"] == 8 and driver[0].exit_code == 0
    assert len(driver[0].artifacts) == EPOCHS  # every committed checkpoint uploaded
    [worker] = [r for r in runs.values() if r is not driver[0]]
    assert [h["worker_loss"] for h in worker.history] == [1 / (i + 1) for i in range(EPOCHS)]
