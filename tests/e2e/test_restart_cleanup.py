"""A restart starts the new group only once the old one is gone -- the forked workers
themselves, not only the stand-ins torch's agent watches -- and removes what the killed
attempt left in the node's staging area."""

from __future__ import annotations

import glob
import os
import signal
import tempfile
import threading
import time

import pytest

import elastic_train as et
from elastic_train.agent.zygote import server as zygote
from elastic_train.torch import TorchTrainer
from tests.conftest import child_pids, pid_alive, wait_until
from tests.support import jobs
from tests.support.process_tree import command_line

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240),
              pytest.mark.usefixtures("no_leaked_processes")]


def _attempt() -> int:
    return int(os.environ["TORCHELASTIC_RESTART_COUNT"])


def _train_noting_pids(config):
    """Writes ``<attempt>-<pid>`` into ``pid_dir``; the first attempt then takes a long
    step (no collective), the next one trains."""
    open(os.path.join(config["pid_dir"], f"{_attempt()}-{os.getpid()}"), "w").close()
    if _attempt() == 0:
        time.sleep(120)
    return jobs.train_mlp(config)


def _stand_ins() -> set[int]:
    return {p for p in child_pids(os.getpid())
            if any(arg.endswith(os.path.join("zygote", "client.py")) for arg in command_line(p))}


def _pause_zygote_and_kill_a_stand_in(pid_dir, seen: dict) -> None:
    """With the zygote paused, the forked workers outlive their stand-ins (as a worker
    that takes seconds to release its GPU does); notes which of the first attempt's
    workers were still alive when the next attempt's stand-ins started, and when."""
    if not wait_until(lambda: len(glob.glob(str(pid_dir / "0-*"))) == 2, 120):
        return
    workers = [int(p.rsplit("-", 1)[1]) for p in glob.glob(str(pid_dir / "0-*"))]
    paused = zygote.running_pid()
    old = _stand_ins()
    os.kill(paused, signal.SIGSTOP)
    try:
        killed_at = time.monotonic()
        os.kill(min(old), signal.SIGKILL)  # a worker failure, as the agent sees it
        if wait_until(lambda: _stand_ins() - old, 90):
            seen["alive"] = [p for p in workers if pid_alive(p)]
            seen["after_s"] = time.monotonic() - killed_at
    finally:
        os.kill(paused, signal.SIGCONT)


@pytest.mark.skipif(not zygote.enabled(), reason="needs the worker zygote")
def test_a_restart_waits_for_the_forked_workers_and_does_not_wait_longer(storage_path,
                                                                          tmp_path):
    """Only the forked workers' death lets the next attempt start, and it starts at once
    (the rest of a failed group is SIGKILLed, not given torch's SIGTERM and 30 s)."""
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    seen: dict = {}
    thread = threading.Thread(target=_pause_zygote_and_kill_a_stand_in, args=(pid_dir, seen),
                              daemon=True)
    thread.start()
    TorchTrainer(
        _train_noting_pids,
        train_loop_config={"epochs": 2, "pid_dir": str(pid_dir)},
        scaling_config=et.ScalingConfig(num_workers=2),
        # the process path: the whole group's workers restart as new processes
        run_config=et.RunConfig(storage_path=storage_path, name="wait-forked",
                                failure_config=et.FailureConfig(max_failures=1,
                                                                restart_in_process=False)),
        datasets={"train": jobs.make_dataset()},
    ).fit()
    thread.join(10)
    assert "alive" in seen, "the next attempt never started"
    assert seen["alive"] == [], "a new group started while the old workers still ran"
    assert seen["after_s"] < 20, f"the restart took {seen['after_s']:.0f} s"


def _train_listing_staging(config):
    """On a restart, rank 0 first lists what the node's staging area holds."""
    if _attempt() > 0 and et.get_context().get_world_rank() == 0:
        found = glob.glob(os.path.join(config["scratch"], "elastic_train_*", "staging", "*"))
        with open(config["listing"], "w") as f:
            f.write("\n".join(os.path.basename(p) for p in found))
    return jobs.train_mlp(config)


def test_a_restart_removes_the_killed_attempts_staged_files(storage_path, tmp_path,
                                                            monkeypatch):
    """Rank 1 is SIGKILLed right after reporting a large checkpoint (its upload still
    staged), and rank 0 -- restarted in process, or as a new process too -- with it while
    it waits to commit: neither staged copy may remain."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # the driver's scratch goes here
    listing = tmp_path / "listing"
    fault = {"rank": 1, "epoch": 2, "batch": 0, "how": "sigkill", "marker": str(tmp_path / "m")}
    TorchTrainer(
        _train_listing_staging,
        train_loop_config={"epochs": 3, "fault": fault, "ballast_mb": 32,
                           "scratch": str(scratch), "listing": str(listing)},
        scaling_config=et.ScalingConfig(num_workers=2),
        run_config=et.RunConfig(storage_path=storage_path, name="staging",
                                failure_config=et.FailureConfig(max_failures=1),
                                checkpoint_config=et.CheckpointConfig(num_to_keep=1)),
        datasets={"train": jobs.make_dataset()},
    ).fit()
    assert listing.exists(), "no restart"
    assert listing.read_text() == "", f"left in staging: {listing.read_text().split()}"

