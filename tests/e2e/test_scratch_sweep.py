"""What a SIGKILLed driver leaves in the temporary directory (its node scratch with
``spec.pkl``, its zygote's socket directory) is removed by the next ``fit()`` on the
node (#24, item 5); a live process's directories, and directories not made by us, stay."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import wait_until
from tests.support.paths import REPO
from tests.support.process_tree import descendants, stop_tree

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")]

OURS = ("elastic_train_", "et-zygote-")
# A process that makes scratch directories as a driver does, says so, and lives on.
LIVE_OWNER = ("from elastic_train._internal import scratch; import sys, time; "
              "print(scratch.make(scratch.NODE_PREFIX), scratch.make(scratch.ZYGOTE_PREFIX), "
              "flush=True); sys.stdin.read()")


def scratch_dirs(tmpdir) -> set[str]:
    return {p.name for p in tmpdir.iterdir() if p.name.startswith(OURS)}


def driver(tmpdir, storage, name, ready, seconds) -> subprocess.Popen:
    env = {**os.environ, "TMPDIR": str(tmpdir), "ELASTIC_TRAIN_ZYGOTE": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.scripts.scratch_driver", storage, name, str(ready),
         str(seconds)], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)


def test_the_next_fit_removes_what_a_killed_driver_left(tmp_path):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    storage = str(tmp_path / "results")
    foreign = tmpdir / "elastic_train_artifact_abc"  # another program's: no owner record
    foreign.mkdir()
    started: list[subprocess.Popen] = []
    pids: list[int] = []
    try:
        live = subprocess.Popen([sys.executable, "-c", LIVE_OWNER], cwd=REPO, text=True,
                                env={**os.environ, "TMPDIR": str(tmpdir)},
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        started.append(live)
        kept = {os.path.basename(p) for p in live.stdout.readline().split()}
        assert len(kept) == 2

        killed = driver(tmpdir, storage, "killed", tmp_path / "ready", 300)
        started.append(killed)
        assert wait_until(lambda: (tmp_path / "ready").exists() or killed.poll() is not None,
                          150), "the first driver's worker never ran"
        assert killed.poll() is None, killed.stdout.read()
        pids = descendants(killed.pid)
        left = scratch_dirs(tmpdir) - kept - {foreign.name}
        assert {n.split("_")[0].split("-")[0] for n in left} >= {"elastic", "et"}, left
        assert any((tmpdir / n / "spec.pkl").exists() for n in left), left
        killed.send_signal(signal.SIGKILL)
        killed.wait(30)
        assert scratch_dirs(tmpdir) - kept - {foreign.name} == left  # nothing cleaned

        later = driver(tmpdir, storage, "later", tmp_path / "ready2", 0)
        started.append(later)
        out, _ = later.communicate(timeout=180)
        assert later.returncode == 0 and "FINISHED" in out, out
        assert not scratch_dirs(tmpdir) & left, f"left behind: {scratch_dirs(tmpdir) & left}"
        assert kept <= scratch_dirs(tmpdir)  # a live owner's stay
        assert foreign.is_dir()
    finally:
        for proc in started:
            if proc.poll() is None:
                stop_tree(proc.pid)
                proc.wait(30)
        for pid in pids:  # the killed driver's zygote and worker, should any be left
            stop_tree(pid)
