"""A zygote that fails: its stand-in, when the zygote never listened (it failed to
start), leaves the worker to a fresh interpreter, and when it died later fails the
worker with the zygote's traceback in its error; the agent notes a start failure."""

import json
import os
import socket
import subprocess
import sys

import pytest

from elastic_train.agent.zygote import server as zygote
from tests.support.paths import REPO

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

TRACEBACK = "Traceback (most recent call last):\n  ...\nKeyError: 'torch'\n"


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def stand_in(path, *argv, **env):
    return subprocess.run([sys.executable, "-I", "-S", zygote.CLIENT, str(path), str(dead_pid()),
                           "tests.support.zygote_target", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": REPO, **env})


def test_a_zygote_that_never_listened_leaves_the_worker_to_a_fresh_interpreter(tmp_path):
    (tmp_path / "error").write_text(TRACEBACK)
    done = stand_in(tmp_path / "socket", "exit", "3", ZYGOTE_TEST_VALUE="fresh")
    assert done.returncode == 3, done.stderr
    assert f"cwd {REPO} value fresh" in done.stdout
    assert "failed to start; this worker starts as a new interpreter" in done.stderr
    assert "KeyError: 'torch'" in done.stderr


def test_a_zygote_that_died_serving_fails_the_worker_with_its_traceback(tmp_path):
    path = tmp_path / "socket"
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        sock.bind(str(path))  # it listened once
    (tmp_path / "error").write_text(TRACEBACK)
    error_file = tmp_path / "error.json"
    done = stand_in(path, "exit", "0", TORCHELASTIC_ERROR_FILE=str(error_file))
    assert done.returncode == 1
    assert "is not running:\nTraceback" in done.stderr and "KeyError: 'torch'" in done.stderr
    assert "KeyError: 'torch'" in json.loads(error_file.read_text())["message"]["message"]
    assert "cwd" not in done.stdout  # no worker ran


def test_a_fresh_zygote_that_fails_to_start_is_noted_and_not_started_again(monkeypatch):
    """The agent's side: a zygote started as a new interpreter dies at its start (leaving
    its traceback): the failure is kept for run.json, and later workers start without
    a zygote instead of starting another that would fail the same way."""
    started, popen = [], subprocess.Popen

    def failing_zygote(argv, **kwargs):
        path = argv[-1]
        code = f"open({os.path.join(os.path.dirname(path), 'error')!r}, 'w').write({TRACEBACK!r})"
        started.append(popen([sys.executable, "-c", code], **kwargs))
        return started[-1]

    monkeypatch.setattr(zygote.subprocess, "Popen", failing_zygote)
    z = zygote.Zygote()
    try:
        assert z.command("tests.support.zygote_target", ()) is not None
        started[0].wait(timeout=30)
        assert z.command("tests.support.zygote_target", ()) is None
        [error] = z.take_start_errors()
        assert not error.forked and "KeyError: 'torch'" in error.error
        assert len(started) == 1 and z.take_start_errors() == []
    finally:
        z.close()
