"""Users' mistakes on the command line, through the real ``elastic-train`` entry point: each
is refused at once with exit code 2 and one line naming the fix, and leaves nothing behind
(issue 42, its "Bad" list)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import fsspec
import pytest

from elastic_train.torch import TorchTrainer
from tests.support.paths import REPO
from tests.support.servers import free_port, no_credentials, s3_options

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120),
              pytest.mark.usefixtures("no_leaked_processes")]

SCRIPT = "tests/e2e/scripts/launch_script.py"
QUICK_S = 20.0  # an answer "at once": the interpreter and torch's import, on a busy machine


def cli(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess,
                                                                float]:
    """``python -m elastic_train.cli ARGS`` and how long it took."""
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "elastic_train.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=100, env=env)
    return proc, time.monotonic() - start


def assert_refused(proc: subprocess.CompletedProcess, took: float, *words: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("elastic-train: "), \
        proc.stderr
    for word in words:
        assert word in proc.stderr
    assert took < QUICK_S, f"{took:.0f} s"


def test_etcd_without_an_endpoint_is_refused_naming_the_flag(tmp_path):
    """It used to wait 33 s for an etcd at 127.0.0.1:80 and leave an empty run directory."""
    proc, took = cli("launch", "--rdzv-backend", "etcd", "--storage-path",
                     str(tmp_path / "results"), SCRIPT, str(tmp_path), "2")
    assert_refused(proc, took, "--rdzv-endpoint is required for --rdzv-backend etcd")
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("args, words", [
    (["nosuch.py"], ["'nosuch.py' does not exist"]),
    (["--nproc-per-node", "0", SCRIPT, "out", "2"], ["--nproc-per-node=0"]),
], ids=["missing-script", "nproc-0"])
def test_verify_resume_mistakes_exit_2_and_leave_no_directory(tmp_path, args, words):
    """Checked before the inner launches start: no CalledProcessError traceback, no empty
    ``elastic_train_verify_*`` directory."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    proc, took = cli("verify-resume", *args, env={**os.environ, "TMPDIR": str(temp)})
    assert_refused(proc, took, *words)
    assert "Traceback" not in proc.stderr and not list(temp.glob("elastic_train_verify_*"))


def test_restore_from_an_unreachable_s3_endpoint_answers_in_seconds(s3_endpoint):
    """A closed port or no credentials: the cause in seconds (it took over a minute of
    retries), while the same run on the real endpoint reads as before."""
    fs = fsspec.filesystem("s3", **s3_options(s3_endpoint))
    fs.mkdir("restore-bucket")
    fs.pipe_file("restore-bucket/runs/r/run.json", b'{"status": "running", "format_version": 1}')
    url = "s3://restore-bucket/runs/r"
    closed = {**s3_options(s3_endpoint), "endpoint_url": f"http://127.0.0.1:{free_port()}"}
    start = time.monotonic()
    assert not TorchTrainer.can_restore(url, storage_options=closed)
    with pytest.raises(Exception, match="cannot reach s3://restore-bucket/runs/r.*endpoint_url"):
        TorchTrainer.restore(url, storage_options=closed)
    assert time.monotonic() - start < QUICK_S
    with pytest.raises(Exception, match=r"trainable.pkl\) is missing"):  # reachable: read
        TorchTrainer.restore(url, storage_options=s3_options(s3_endpoint))

    proc, took = cli("restore", url, "--storage-option", f"endpoint_url={closed['endpoint_url']}",
                     "--storage-option", "key=testing", "--storage-option", "secret=testing")
    assert_refused(proc, took, "cannot reach", "endpoint_url=")
    proc, took = cli("restore", url, "--storage-option", f"endpoint_url={s3_endpoint}",
                     env=no_credentials())
    assert_refused(proc, took, "credentials")
