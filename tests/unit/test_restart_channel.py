"""Unit tests: the records an agent and its workers exchange for in-process restarts, and
how a worker tells its own error from one a peer caused."""

from __future__ import annotations

import threading
import time

import pytest

from elastic_train.worker.inprocess import channel
from elastic_train.worker.inprocess import loop as inprocess
from elastic_train.worker.inprocess.channel import FailureNote, Go, NewWorld, Stage, WorkerRecord


def test_records_round_trip(tmp_path):
    note = FailureNote("ValueError: x", "Traceback ...", primary=True, timestamp=1.5)
    record = WorkerRecord(attempt=2, stage=Stage.READY, pid=42, failure=note)
    channel.write_record(str(tmp_path), 3, record)
    assert channel.read_record(str(tmp_path), 3) == record
    assert channel.read_record(str(tmp_path), 4) is None


def test_wait_for_go_returns_for_this_attempt_or_a_later_one(tmp_path):
    channel.write_go(str(tmp_path), Go(1, 1))
    later = threading.Timer(0.1, channel.write_go, (str(tmp_path), Go(3, 5, 29999)))
    later.start()
    started = time.monotonic()
    assert channel.wait_for_go(str(tmp_path), 2) == Go(3, 5, 29999)
    assert time.monotonic() - started >= 0.09


WORLD = NewWorld(generation="g2", group_rank=1, group_world_size=2, base_rank=2,
                 world_size=4, base_role_rank=2, role_world_size=4, master_addr="node0")


def test_a_new_world_lets_a_waiting_worker_of_the_old_one_go(tmp_path):
    """After a membership change the new world's attempts count from 0: its go lets a
    worker of another generation go, whatever attempt it waited for -- and only that."""
    go = Go(0, 3, 29500, WORLD)
    channel.write_go(str(tmp_path), go)
    assert channel.read_go(str(tmp_path)) == go
    assert go.lets(5, "g1") and not go.lets(1, "g2") and go.lets(0, "g2")
    assert not Go(0, 3).lets(5, "g1")
    assert channel.wait_for_go(str(tmp_path), 5, "g1") == go


def test_a_new_world_gives_each_worker_its_rank(tmp_path):
    env = Go(0, 3, 29500, WORLD).environ(local_rank=1)
    assert {k: env[k] for k in ("RANK", "WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                                "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT",
                                "TORCHELASTIC_RESTART_COUNT", "ELASTIC_TRAIN_ATTEMPT",
                                "ELASTIC_TRAIN_GENERATION")} == {
        "RANK": "3", "WORLD_SIZE": "4", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2",
        "ROLE_RANK": "3", "MASTER_ADDR": "node0", "MASTER_PORT": "29500",
        "TORCHELASTIC_RESTART_COUNT": "3", "ELASTIC_TRAIN_ATTEMPT": "0",
        "ELASTIC_TRAIN_GENERATION": "g2"}
    assert "RANK" not in Go(2, 3).environ(local_rank=1)  # the same world: ranks stay


def test_clear_forgets_the_previous_group(tmp_path):
    channel.write_go(str(tmp_path), Go(1, 1))
    channel.write_record(str(tmp_path), 0, WorkerRecord(1, Stage.RUNNING, 1))
    channel.clear(str(tmp_path))
    assert channel.read_go(str(tmp_path)) is None
    assert channel.read_record(str(tmp_path), 0) is None


def _raise_in_user_code() -> None:
    raise ValueError("nan")


@pytest.mark.parametrize("broken_collective", [False, True])
def test_errors_out_of_torch_distributed_are_not_primary(broken_collective):
    import torch.distributed as dist

    try:
        if broken_collective:  # raised inside torch.distributed, as a broken collective is
            dist.all_reduce(None)
        _raise_in_user_code()
    except Exception as exc:  # noqa: BLE001
        note = inprocess.describe(exc)
    assert note.primary is not broken_collective
    assert note.traceback.startswith("Traceback")
