"""``elastic-train verify-resume`` tells a script that resumes exactly from one that does not."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.paths import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240),
              pytest.mark.usefixtures("no_leaked_processes")]



@pytest.mark.parametrize("extra,code,verdict", [
    ([], 0, "OK: after a crash at report 2"),
    (["--forget-optimizer"], 1, "DIFFERENT: the resumed run's final checkpoint differs in "
                                "state.pt"),
])
def test_verify_resume(tmp_path, extra, code, verdict):
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "elastic_train.cli", "verify-resume", "--workdir",
         str(tmp_path / "runs"), "--fail-at-report", "2", "tests/e2e/launch_script.py", str(out),
         "5", *extra],
        cwd=REPO, capture_output=True, text=True, timeout=220)
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert verdict in proc.stdout
