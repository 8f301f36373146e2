"""The python blocks of the README and the guides that train (call ``fit()``) run as a
user would run them, each in a process of its own with HOME a temporary directory (where
``RunConfig`` keeps its runs by default), so the docs cannot rot (#39; the rest:
tests/unit/test_doc_blocks.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.doc_blocks import PRELUDES, runnable

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(150)
@pytest.mark.parametrize("block", runnable("python", with_fit=True), ids=str)
def test_python_block_that_trains_runs(block, tmp_path):
    prelude = PRELUDES.get(block.key, ("", ""))[1]
    done = subprocess.run([sys.executable, "-c", prelude + block.code], cwd=tmp_path,
                          capture_output=True, text=True, timeout=130,
                          env={**os.environ, "HOME": str(tmp_path)})
    assert done.returncode == 0, f"{block}:\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
    assert (tmp_path / "elastic_train_results").is_dir(), "the run was not kept under HOME"
