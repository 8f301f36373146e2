"""The session of a launched script is built by whichever session call comes first:
building it must not need every rank (only the agreement on the checkpoint does)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.paths import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180),
              pytest.mark.usefixtures("no_leaked_processes")]


def test_get_context_on_rank_0_alone_does_not_block(storage_path, tmp_path):
    """``if rank == 0: elastic_train.get_context()`` right after init_process_group(),
    then the script's own collectives (DDP's parameter broadcast) and reports."""
    proc = subprocess.run(
        [sys.executable, "-m", "elastic_train.cli", "launch", "--standalone",
         "--nproc-per-node", "2", "--storage-path", storage_path, "--name", "ctx",
         "tests/e2e/scripts/launch_script.py", str(tmp_path), "3", "--context-on-rank0-first"],
        cwd=REPO, capture_output=True, text=True, timeout=150)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "[rank0]: CONTEXT ctx" in out
    assert (tmp_path / "starts").read_text().split() == ["0", "2"]
