"""The python blocks of the README and the guides that train run as a user would run
them, with HOME a temporary directory (where runs are kept by default), so the docs
cannot rot (#39; the rest: tests/unit/test_doc_blocks.py): those that call ``fit()`` in a
process of their own, launch scripts under ``elastic-train launch``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.doc_blocks import (
    LAUNCH_SCRIPTS,
    doc_blocks,
    run_python_block,
    runnable,
    with_prelude,
)
from tests.support.process_tree import stop_tree

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(150)
@pytest.mark.parametrize("block", runnable("python", with_fit=True), ids=str)
def test_python_block_that_trains_runs(block, tmp_path):
    run_python_block(block, tmp_path, timeout_s=130)
    assert (tmp_path / "elastic_train_results").is_dir(), "the run was not kept under HOME"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("block", [b for b in doc_blocks() if b.key in LAUNCH_SCRIPTS],
                         ids=str)
def test_launch_script_block_runs_under_launch(block, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(with_prelude(block))
    proc = subprocess.Popen(
        [sys.executable, "-m", "elastic_train.cli", "launch", "--standalone",
         "--nproc-per-node", "2", str(script)], cwd=tmp_path, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "HOME": str(tmp_path)})
    try:
        said, _ = proc.communicate(timeout=100)
    finally:
        stop_tree(proc.pid)
    assert proc.returncode == 0, f"{block}:\n{said[-4000:]}"
    assert (tmp_path / "elastic_train_results").is_dir(), "the run was not kept under HOME"
