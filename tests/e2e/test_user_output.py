"""A launched script's own logging set-up and progress bars reach the console as they would
under plain Python: ``logging.basicConfig`` takes effect, and a ``\\r`` progress bar shows
while it runs, with its rank prefix (not only once it finishes)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from tests.conftest import wait_until
from tests.support.paths import REPO
from tests.support.servers import stop_process

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150),
              pytest.mark.usefixtures("no_leaked_processes")]


def test_user_logging_and_a_live_progress_bar(tmp_path):
    go = tmp_path / "go"
    proc = subprocess.Popen(
        [sys.executable, "-m", "elastic_train.cli", "launch", "--standalone", "--quiet",
         "--storage-path", str(tmp_path / "results"), "tests/e2e/scripts/user_output_script.py",
         str(go)], cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        # The bar is shown while the script still waits for it to be seen.
        shown = wait_until(lambda: any(line.startswith("[rank0]: progress 1/2")
                                       for line in lines), 90)
        go.touch()
        assert proc.wait(60) == 0
    finally:
        stop_process(proc)
    reader.join(10)
    out = "".join(lines)
    assert shown, out
    assert "[rank0]: progress 2/2 SEEN\n" in out
    assert "[rank0]: USERLOG INFO configured by the user\n" in out
    assert "RuntimeWarning" not in out and "found in sys.modules" not in out
    assert os.path.exists(tmp_path / "results")
