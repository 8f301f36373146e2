"""A run written by an older version restores: its trainable.pkl names modules at the
paths they had then (``elastic_train.pickling._named_code`` before ``pickling`` moved
under ``elastic_train/_internal/``), which storage maps to their new homes."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from elastic_train._internal.moved_modules import MOVED
from elastic_train.torch import TorchTrainer
from tests.support.paths import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120),
              pytest.mark.usefixtures("no_leaked_processes")]

SAVED = os.path.join(REPO, "tests", "data", "run_saved_before_internal")


def test_a_run_saved_before_the_modules_moved_restores_from_its_checkpoint(tmp_path):
    run_path = str(tmp_path / "run_saved_before_internal")
    shutil.copytree(SAVED, run_path)
    assert TorchTrainer.can_restore(run_path)
    result = TorchTrainer.restore(run_path).fit()
    assert result.metrics["step"] == 3
    assert result.metrics["restored_from"] == 2  # from the saved checkpoint, not step 0
    with result.checkpoint.as_directory() as d, open(os.path.join(d, "step")) as f:
        assert f.read() == "3"
    # read at the new paths: no old module was imported (an older install on the path,
    # as an editable one of another checkout, could still hold them)
    assert not sorted(old for old in MOVED if old in sys.modules)
