"""GPU fork safety, proved on CPU: torch's CUDA build marks a process a bad fork when its
parent asked the CUDA runtime for devices (``torch.cuda.is_available()``), and on a GPU
such a worker dies at its first CUDA call (``Cannot re-initialize CUDA in forked
subprocess``). No worker may be one: not when the user's script asked before fit(), not
under ``launch --nproc-per-node auto`` (which counts the accelerators), not a replacement
forked after a SIGKILL."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tests.support.paths import REPO

pytestmark = [
    pytest.mark.e2e, pytest.mark.timeout(180),
    pytest.mark.skipif(not hasattr(torch._C, "_cuda_isInBadFork"),
                       reason="torch's CPU-only build has no fork poison to see"),
]


def _verdicts(out) -> dict[str, str]:
    return {p.name: p.read_text() for p in out.iterdir() if p.name.startswith("rank-")}


@pytest.fixture(scope="module")
def driver_run(tmp_path_factory):
    """A driver that asked for CUDA, then fit() with rank 1 SIGKILLed once: its ``out``."""
    tmp_path = tmp_path_factory.mktemp("driver")
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run([sys.executable, "-m", "tests.e2e.scripts.fork_poison_driver",
                           str(tmp_path / "results"), str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def test_a_driver_that_asked_for_cuda_before_fit_forks_clean_workers(driver_run):
    verdicts = _verdicts(driver_run)
    assert any("rank-1-attempt-1" in name for name in verdicts), verdicts  # the replacement
    assert set(verdicts.values()) == {"clean"}, verdicts


def test_a_restart_after_a_sigkill_starts_with_the_standby_forked_before_it(driver_run):
    """The first worker of the restart does not wait for a fork (nor, on a GPU, for a CUDA
    context): the zygote's standby, forked while training ran, takes its slot. (Rank 0
    has returned by then, so both ranks get new processes here.)"""
    killed = int((driver_run / "killed").read_text())
    restarted = [int(p.read_text()) for p in driver_run.glob("started-rank-*-attempt-1")]
    assert len(restarted) == 2 and min(restarted) < killed, (restarted, killed)


@pytest.mark.parametrize("nproc", ["auto", "2"])
def test_launch_counting_accelerators_forks_clean_workers(tmp_path, nproc):
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "elastic_train.cli", "launch", "--standalone",
         "--nproc-per-node", nproc, "--storage-path", str(tmp_path / "results"),
         os.path.join(REPO, "tests/e2e/scripts/fork_poison_script.py"), str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verdicts = _verdicts(out)
    assert len(verdicts) >= 1 and set(verdicts.values()) == {"clean"}, verdicts


@pytest.mark.parametrize("nproc", ["auto", "gpu"])
def test_counting_devices_leaves_the_process_forkable(nproc):
    """``launch``'s device count (``gpu`` fails here: no GPU) leaves no poison behind."""
    code = f"""
import os, torch
from elastic_train.driver.launch_rules import local_world_size
from elastic_train.errors import ConfigError
try:
    local_world_size({nproc!r}, "--nproc-per-node")
except ConfigError as exc:
    print("error:", exc)
pid = os.fork()
if pid == 0:
    os._exit(3 if torch.cuda._is_in_bad_fork() else 0)
print("child:", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert "child: 0" in proc.stdout, proc.stdout + proc.stderr
