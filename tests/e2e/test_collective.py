"""End-to-end: ``elastic_train.collective`` (Ray's ``ray.train.collective``) on 2 real
workers under fit()."""

from __future__ import annotations

import threading
import time

import pytest

import elastic_train as et
from elastic_train.collective import barrier, broadcast_from_rank_zero
from elastic_train.torch import TorchTrainer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180),
              pytest.mark.usefixtures("no_leaked_processes")]


def _agree(config):
    """Rank 0's value reaches both ranks, whatever size and kind; the barrier holds rank 0
    until rank 1, which arrives a second late, has reached it too."""
    rank = et.get_context().get_world_rank()
    mine = {"rank": rank, "blob": bytes(range(256)) * 40, "square": lambda x: x * x}
    got = broadcast_from_rank_zero(mine if rank == 0 else None)
    if rank == 1:
        time.sleep(1.0)
    before = time.monotonic()
    barrier()
    waited = time.monotonic() - before
    return {"rank": rank, "from": got["rank"], "blob": len(got["blob"]),
            "square": got["square"](7), "waited": waited}


def _unpicklable(config):
    """Rank 0 sends a lock; rank 1 notes what it was told before it fails too."""
    rank = et.get_context().get_world_rank()
    try:
        broadcast_from_rank_zero(threading.Lock() if rank == 0 else None)
    except RuntimeError as exc:
        with open(config["told"], "w") as f:
            f.write(str(exc))
        raise


def test_broadcast_from_rank_zero_and_barrier(storage_path):
    result = TorchTrainer(_agree, scaling_config=et.ScalingConfig(num_workers=2),
                          run_config=et.RunConfig(storage_path=storage_path, name="agree")).fit()
    assert result.return_value["from"] == 0
    assert result.return_value["blob"] == 10240  # Ray refuses over 1 kB; we send any size
    assert result.return_value["square"] == 49  # a lambda: cloudpickle, as Ray's
    assert result.return_value["waited"] > 0.5  # rank 0 waited for rank 1


def test_data_rank_0_cannot_pickle_fails_every_rank_at_once(storage_path, tmp_path):
    told = tmp_path / "told"
    trainer = TorchTrainer(_unpicklable, train_loop_config={"told": str(told)},
                           scaling_config=et.ScalingConfig(num_workers=2),
                           run_config=et.RunConfig(storage_path=storage_path, name="unpicklable",
                                                   failure_config=et.FailureConfig(max_failures=0)))
    with pytest.raises(et.TrainingFailedError) as caught:
        trainer.fit()
    message = str(caught.value)
    assert "TypeError: cannot pickle '_thread.lock' object" in message, message
    assert told.read_text() == ("broadcast_from_rank_zero(): rank 0 could not pickle its "
                                "data (TypeError: cannot pickle '_thread.lock' object).")
