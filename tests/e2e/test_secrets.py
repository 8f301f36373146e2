"""Credentials are never written: an etcd ``password=`` in ``--rdzv-conf`` or
``PET_RDZV_CONF`` appears in no file of the run directory and in no output, not in the
failure text, the resume hint or the "stopped by" line -- and the redacted run can still
be restored, with the password given again. (One node on the etcd backend, which takes a
``password``; without a ``username`` it is not sent to etcd.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import wait_until
from tests.support.paths import REPO
from tests.support.servers import stop_process

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240),
              pytest.mark.usefixtures("no_leaked_processes")]

SCRIPT = os.path.join(REPO, "tests/e2e/scripts/launch_script.py")
CLI = [sys.executable, "-m", "elastic_train.cli"]


def _files_holding(root: str, secret: str) -> list[str]:
    found = []
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                if secret.encode() in f.read():
                    found.append(path)
    return found


def _on_etcd(endpoint: str) -> list[str]:
    return ["--rdzv-backend", "etcd", "--rdzv-endpoint", endpoint]


def test_rdzv_password_is_redacted_in_run_json_hints_and_failure_text(storage_path, tmp_path,
                                                                      etcd_endpoint):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    proc = subprocess.run(
        [*CLI, "launch", "--nproc-per-node", "1", *_on_etcd(etcd_endpoint), "--rdzv-conf",
         "join_timeout=60,password=hunter2", "--storage-path", storage_path, "--name", "flag",
         SCRIPT, str(out_dir), "3", "--crash-at", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "run the same command again" in proc.stderr  # the resume hint is printed ...
    assert "password=***" in proc.stderr  # ... redacted
    assert "hunter2" not in proc.stdout + proc.stderr
    assert _files_holding(storage_path, "hunter2") == []
    show = subprocess.run([*CLI, "show", os.path.join(storage_path, "flag")], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert "hunter2" not in show.stdout + show.stderr
    restore = [*CLI, "restore", os.path.join(storage_path, "flag")]
    refused = subprocess.run(restore, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "password" in refused.stderr, refused.stderr
    env = {**os.environ, "PET_RDZV_CONF": "password=hunter2"}
    restored = subprocess.run(restore, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=180)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    assert "hunter2" not in restored.stdout + restored.stderr
    assert _files_holding(storage_path, "hunter2") == []


def test_pet_rdzv_conf_password_is_redacted_when_interrupted(storage_path, tmp_path,
                                                            etcd_endpoint):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    env = {**os.environ, "PET_RDZV_CONF": "password=hunter3"}
    proc = subprocess.Popen(
        [*CLI, "launch", "--nproc-per-node", "1", *_on_etcd(etcd_endpoint),
         "--storage-path", storage_path,
         "--name", "env", SCRIPT, str(out_dir), "40", "--sleep", "0.2"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        marker = os.path.join(storage_path, "env", "checkpoint_000000", ".commit.json")
        assert wait_until(lambda: os.path.exists(marker), 150)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        stop_process(proc)
    assert "resume with" in out, out
    assert "hunter3" not in out
    assert _files_holding(storage_path, "hunter3") == []
