"""What the driver hands on: callbacks get a checkpoint only once it is committed, and a
resume with another ``checkpoint_score_attribute`` re-ranks the stored checkpoints instead
of failing every ``report()``."""

from __future__ import annotations

import os

import pytest

import elastic_train as et
from elastic_train.storage.checkpoint_store import MARKER
from elastic_train.torch import TorchTrainer
from tests.conftest import EPOCHS, fit
from tests.support import jobs
from tests.support.stale_fs import NodeCacheFS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240),
              pytest.mark.usefixtures("no_leaked_processes")]


class Recorder(et.UserCallback):
    """Records, for each report with a checkpoint, whether its commit marker existed."""

    def __init__(self):
        self.seen: list[tuple[int, bool]] = []

    def after_report(self, run_context, metrics, checkpoint):
        if checkpoint is not None:
            committed = os.path.exists(os.path.join(checkpoint.path, MARKER))
            self.seen.append((metrics[0]["training_iteration"], committed))


def test_callbacks_get_checkpoints_only_once_committed(storage_path, tmp_path):
    """Uploads are slowed down (each upload marker takes 1 s to read), so every
    checkpoint is reported well before it is committed."""
    recorder = Recorder()
    slow = NodeCacheFS(str(tmp_path / "cache"), negative_ttl_s=0, slow_marks_s=1.0,
                       skip_instance_cache=True)
    TorchTrainer(
        jobs.train_mlp, train_loop_config={"epochs": 4, "upload_mode": "ASYNC"},
        scaling_config=et.ScalingConfig(num_workers=2),
        run_config=et.RunConfig(storage_path=storage_path, name="handover",
                                storage_filesystem=slow, callbacks=[recorder]),
        datasets={"train": jobs.make_dataset()},
    ).fit()
    assert recorder.seen == [(i, True) for i in range(1, 5)]


def test_resume_with_another_score_attribute_reranks_the_stored_checkpoints(
        storage_path, tmp_path, baseline):
    def keep_best(attribute):
        return et.CheckpointConfig(num_to_keep=1, checkpoint_score_attribute=attribute,
                                   checkpoint_score_order="max")

    fault = {"rank": 0, "epoch": 2, "how": "raise", "marker": str(tmp_path / "fault")}
    with pytest.raises(et.TrainingFailedError):
        fit(storage_path, "rerank", config={"fault": fault}, checkpoint_config=keep_best("score"))
    # "val" is reported from now on only: the stored checkpoints have no such metric.
    result = fit(storage_path, "rerank", config={"extra_metrics": ["val"]},
                 checkpoint_config=keep_best("val"))
    assert result.return_value["digest"] == baseline.return_value["digest"]
    assert [os.path.basename(c.path) for c, _ in result.best_checkpoints] \
        == [f"checkpoint_{EPOCHS - 1:06d}"]
