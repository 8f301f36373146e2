"""The python blocks of the README and the guides that train (call ``fit()``) run as a
user would run them, each in a process of its own with HOME a temporary directory (where
``RunConfig`` keeps its runs by default), so the docs cannot rot (#39; the rest:
tests/unit/test_doc_blocks.py)."""

from __future__ import annotations

import pytest

from tests.support.doc_blocks import run_python_block, runnable

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(150)
@pytest.mark.parametrize("block", runnable("python", with_fit=True), ids=str)
def test_python_block_that_trains_runs(block, tmp_path):
    run_python_block(block, tmp_path, timeout_s=130)
    assert (tmp_path / "elastic_train_results").is_dir(), "the run was not kept under HOME"
