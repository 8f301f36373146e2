"""``elastic-train restore PATH`` of a launch run: it shows what it runs, refuses programs
that are not a launch of a script unless confirmed, continues the run at PATH (an archived
``job.failed-...`` too, whatever HOME is now), runs from the current directory, and keeps
``--storage-option``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.support.paths import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300),
              pytest.mark.usefixtures("no_leaked_processes")]

SCRIPT = os.path.join(REPO, "tests/e2e/scripts/launch_script.py")
CLI = [sys.executable, "-m", "elastic_train.cli"]


def _cli(*args, cwd=REPO, env=None, timeout=180):
    return subprocess.run([*CLI, *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _state(run_dir) -> dict:
    with open(os.path.join(run_dir, "run.json")) as f:
        return json.load(f)


def _failed_launch(storage_path, name, out_dir, *extra, cwd=REPO, env=None, script=SCRIPT):
    """A launch run that crashes at epoch 1, after checkpoint 0 (no restarts)."""
    out_dir.mkdir(exist_ok=True)
    proc = _cli("launch", "--nproc-per-node", 1, *extra, "--name", name, script, out_dir, 3,
                "--crash-at", 1, cwd=cwd, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return proc


def test_no_python_program_is_shown_and_refused_unless_confirmed(storage_path, tmp_path):
    ran = tmp_path / "ran"
    proc = _cli("launch", "--storage-path", storage_path, "--name", "sh", "--no-python",
                "/bin/sh", "-c", f"echo once >> {ran}; exit 1")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    run_dir = os.path.join(storage_path, "sh")
    refused = _cli("restore", run_dir)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "/bin/sh" in refused.stderr and "--no-python" in refused.stderr
    assert "--trust-command" in refused.stderr
    assert ran.read_text().splitlines() == ["once"]  # not run again
    confirmed = _cli("restore", run_dir, "--trust-command")
    assert confirmed.returncode == 1 and "/bin/sh" in confirmed.stderr
    assert ran.read_text().splitlines() == ["once", "once"]


def test_archived_run_is_continued_at_the_path_given_whatever_home_is(tmp_path):
    home, other_home = tmp_path / "home", tmp_path / "other"
    home.mkdir()
    other_home.mkdir()
    out_dir = tmp_path / "out"
    _failed_launch("~/elastic_train_results", "job", out_dir,  # the default, as stored
                   env={**os.environ, "HOME": str(home)})
    results = home / "elastic_train_results"
    archived = results / "job.failed-20260101T000000Z"
    os.rename(results / "job", archived)  # as --start-over leaves it
    restored = _cli("restore", archived, env={**os.environ, "HOME": str(other_home)})
    assert restored.returncode == 0, restored.stdout + restored.stderr
    assert "restoring" in restored.stderr and SCRIPT in restored.stderr
    state = _state(archived)
    assert state["status"] == "finished" and len(state["launches"]) == 2
    assert not (results / "job").exists() and not (other_home / "elastic_train_results").exists()


def test_restore_runs_in_the_current_directory_not_the_stored_one(storage_path, tmp_path):
    launched_from, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    launched_from.mkdir()
    elsewhere.mkdir()
    shutil.copy(SCRIPT, launched_from / "train.py")
    _failed_launch(storage_path, "rel", tmp_path / "out", "--storage-path", storage_path,
                   cwd=launched_from, script="train.py")
    run_dir = os.path.join(storage_path, "rel")
    refused = _cli("restore", run_dir, cwd=elsewhere)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "train.py" in refused.stderr and str(launched_from) in refused.stderr
    assert len(_state(run_dir)["launches"]) == 1
    restored = _cli("restore", run_dir, cwd=launched_from)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    assert _state(run_dir)["status"] == "finished"


def test_restore_of_a_launch_run_keeps_storage_options(tmp_path, s3_endpoint):
    from tests.conftest import make_storage

    storage = make_storage("s3", tmp_path, s3_endpoint)
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_ENDPOINT_URL": s3_endpoint, "AWS_DEFAULT_REGION": "us-west-2"}
    _failed_launch(storage.url, "s3run", tmp_path / "out", "--storage-path", storage.url,
                   env=env)
    bare = {k: v for k, v in env.items()
            if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL")}
    restored = _cli("restore", f"{storage.url}/s3run", "--storage-option",
                    f"endpoint_url={s3_endpoint}", "--storage-option", "key=testing",
                    "--storage-option", "secret=testing", env=bare)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    state = storage.run("s3run").read_run_state()
    assert state.status.value == "finished" and len(state.launches) == 2
    assert "testing" not in json.dumps(state.to_json())
