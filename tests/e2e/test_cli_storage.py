"""``launch``, ``ls`` and ``show`` on S3 (moto's server) with ``--storage-option``; what a
missing bucket or missing credentials look like: one line, exit code 2, no botocore
traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import fsspec
import pytest

from tests.support.paths import REPO
from tests.support.servers import no_credentials, s3_options

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240),
              pytest.mark.usefixtures("no_leaked_processes")]

CLI = [sys.executable, "-m", "elastic_train.cli"]


def run(*args, env=None):
    return subprocess.run([*CLI, *args], cwd=REPO, text=True, capture_output=True,
                          timeout=180, env=env)


def test_launch_ls_show_on_s3_with_storage_options(s3_endpoint, tmp_path):
    fsspec.filesystem("s3", **s3_options(s3_endpoint)).mkdir("cli-bucket")
    options = ["--storage-option", f"endpoint_url={s3_endpoint}", "--storage-option",
               "key=testing", "--storage-option", "secret=testing"]
    storage = "s3://cli-bucket/runs"
    proc = run("launch", "--standalone", "--quiet", "--storage-path", storage, *options,
               "--name", "s3run", "tests/e2e/scripts/launch_script.py", str(tmp_path), "2",
               env=no_credentials())
    assert proc.returncode == 0, proc.stdout + proc.stderr

    listed = run("ls", storage, "--json", *options, env=no_credentials())
    assert listed.returncode == 0, listed.stderr
    (entry,) = json.loads(listed.stdout)
    assert entry["name"] == "s3run" and entry["status"] == "finished"
    assert entry["best_checkpoint"] == "checkpoint_000001"
    command = entry["spec"]["command"]
    assert f"endpoint_url={s3_endpoint}" in command and "secret=testing" not in command

    shown = run("show", f"{storage}/s3run", *options, env=no_credentials())
    assert shown.returncode == 0 and "status:   finished" in shown.stdout, shown.stderr


def test_missing_bucket_and_missing_credentials_are_one_line(s3_endpoint):
    endpoint = ["--storage-option", f"endpoint_url={s3_endpoint}"]
    creds = ["--storage-option", "key=testing", "--storage-option", "secret=testing"]
    missing = run("ls", "s3://no-such-bucket/runs", *endpoint, *creds)
    assert missing.returncode == 2
    assert missing.stderr.count("\n") == 1 and "does not exist" in missing.stderr

    anonymous = run("show", "s3://no-such-bucket/runs/x", *endpoint, env=no_credentials())
    assert anonymous.returncode == 2, anonymous.stderr
    assert anonymous.stderr.count("\n") == 1 and "Traceback" not in anonymous.stderr
    assert "credentials" in anonymous.stderr
