"""get_all_reported_checkpoints()'s wait: up to the deadline, then what is committed (as
Ray's); this rank's upload error ends it at once."""

from __future__ import annotations

import time

import pytest

from elastic_train.errors import StorageError
from elastic_train.storage import RunStorage
from elastic_train.worker.reported_checkpoints import wait_until_committed


def test_the_wait_ends_at_the_deadline_or_at_this_ranks_upload_error(tmp_path):
    store = RunStorage.open(str(tmp_path), "run").checkpoints
    started = time.monotonic()
    assert not wait_until_committed(store, 0, lambda: None, deadline=started + 0.2)
    assert 0.2 <= time.monotonic() - started < 5

    def failed() -> None:
        raise StorageError("checkpoint_000000 (rank 1): disk full")

    with pytest.raises(StorageError, match="disk full"):
        wait_until_committed(store, 0, failed, deadline=None)
