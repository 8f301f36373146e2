"""Unit tests: the records an agent and its workers exchange for in-process restarts, and
how a worker tells its own error from one a peer caused."""

from __future__ import annotations

import threading
import time

import pytest

from elastic_train.worker import inprocess
from elastic_train.worker import restart_channel as channel
from elastic_train.worker.restart_channel import FailureNote, Go, Stage, WorkerRecord


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
