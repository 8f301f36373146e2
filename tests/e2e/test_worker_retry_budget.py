"""``RunConfig.storage_retry_timeout_s`` reaches what reads checkpoints in a worker
outside its session: the node's local tier and DCP's CheckpointReader (before, both
kept the 120 s default whatever the run said)."""

from __future__ import annotations

import pytest

import elastic_train as et
from elastic_train.torch import TorchTrainer


def budgets(config):
    from elastic_train.storage.dcp import CheckpointReader
    from elastic_train.storage.local_tier import LocalTier

    checkpoint = et.Checkpoint.from_directory(config["directory"])
    return {"tier": LocalTier.of_node().retry.budget_s,
            "reader": CheckpointReader(checkpoint)._retry.budget_s}


@pytest.mark.e2e
@pytest.mark.timeout(180)
def test_the_runs_retry_budget_reaches_checkpoint_readers_in_workers(tmp_path):
    (tmp_path / "ckpt").mkdir()
    result = TorchTrainer(
        budgets, train_loop_config={"directory": str(tmp_path / "ckpt")},
        scaling_config=et.ScalingConfig(num_workers=1),
        run_config=et.RunConfig(storage_path=str(tmp_path / "results"), name="budget",
                                storage_retry_timeout_s=7),
    ).fit()
    assert result.return_value == {"tier": 7.0, "reader": 7.0}
