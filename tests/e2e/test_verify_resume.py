"""``elastic-train verify-resume`` tells a script that resumes exactly from one that does not."""

from __future__ import annotations

import os
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
    """A passing script: three lines, nothing on stderr (the injected crash's messages are
    expected, so they stay in the launch's log), and its temporary directory removed. A
    script that does not resume exactly: its runs kept, and where they are said."""
    out, temp = tmp_path / "out", tmp_path / "tmp"
    out.mkdir()
    temp.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "elastic_train.cli", "verify-resume", "--fail-at-report", "2",
         "tests/e2e/scripts/launch_script.py", str(out), "5", *extra],
        cwd=REPO, capture_output=True, text=True, timeout=220,
        env={**os.environ, "TMPDIR": str(temp)})
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert verdict in proc.stdout
    kept = list(temp.glob("elastic_train_verify_*"))  # torch writes there too
    if code == 0:
        assert proc.stdout.count("\n") == 3 and not proc.stderr, proc.stdout + proc.stderr
        assert not kept
    else:
        assert len(kept) == 1 and f"The runs are in {kept[0]}." in proc.stdout
