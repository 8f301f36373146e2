"""The chaos suite's faults on who writes the run directory, and on what storage shows.

``second_driver``: while the job trains, a second driver starts the same run (same
name and storage, same train function); it must be refused before it starts a
process, and the live job must finish undisturbed. ``stale_lookups``: the job's
storage answers "not found" for commit markers created after a first lookup, for
30 s (an NFS client's negative cache, :class:`tests.support.stale_fs.NodeCacheFS`),
uploads are slow (so the driver's live view looks up each marker before it is
written), and a worker is SIGKILLed; the restart must not delete or skip a
committed checkpoint its node still sees as missing.
"""

from __future__ import annotations

import os
import subprocess
import sys

import elastic_train as et
from elastic_train.torch import TorchTrainer
from tests.chaos.faults import (
    EPOCHS,
    NUM_TO_KEEP,
    Outcome,
    StorageWatcher,
    Trial,
    _at_fault_time,
    _outcome,
)
from tests.conftest import StorageUnderTest
from tests.support import jobs
from tests.support.paths import REPO
from tests.support.stale_fs import NODE_ENV, NodeCacheFS


def run_writer_trial(trial: Trial, storage: StorageUnderTest, tmp_path, name: str) -> Outcome:
    if trial.kind == "second_driver":
        return _second_driver_trial(trial, storage, tmp_path, name)
    return _stale_lookups_trial(trial, storage, tmp_path, name)


def _driver(storage: StorageUnderTest, name: str, pid_dir) -> subprocess.Popen:
    """``tests.e2e.scripts.driver`` with slow steps (5 s an epoch): the first one still trains when
    the second, started at the trial's time, has imported torch and looks at the run."""
    pid_dir.mkdir()
    return subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.scripts.driver", storage.url, name, str(pid_dir),
         str(EPOCHS), "0.8"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)


def _second_driver_trial(trial: Trial, storage: StorageUnderTest, tmp_path, name: str
                         ) -> Outcome:
    """Driver A trains; at the fault time driver B starts the same run and must be refused
    (no worker of B ever started); A must end as an uninterrupted run does."""
    run_storage = storage.run(name)
    with StorageWatcher(run_storage) as watcher:
        first = _driver(storage, name, tmp_path / "first")
        try:
            assert _at_fault_time(trial, storage, name, tmp_path), "no checkpoint yet"
            second = _driver(storage, name, tmp_path / "second")
            second_out, _ = second.communicate(timeout=150)
            first_out, _ = first.communicate(timeout=200)
        finally:
            if first.poll() is None:
                first.kill()
                first.wait()
    assert first.returncode == 0, first_out[-3000:]
    digest = next(line.split()[1] for line in first_out.splitlines()
                  if line.startswith("DIGEST"))
    outcome = _outcome(digest, run_storage, watcher, tmp_path, num_to_keep=None)
    outcome.second_refused = (second.returncode != 0 and "is in use by" in second_out
                              and not list((tmp_path / "second").glob("worker-*")))
    if not outcome.second_refused:  # say what it did: joined, or came after the run ended
        outcome.kind_failures.append(f"the second driver (exit {second.returncode}) said: "
                                     f"{second_out[-1500:]}")
    return outcome


def _stale_lookups_trial(trial: Trial, storage: StorageUnderTest, tmp_path, name: str
                         ) -> Outcome:
    """A worker SIGKILL at the trial's time, on storage with stale negative lookups."""
    config = {"epochs": EPOCHS, "events_file": str(tmp_path / "events"), "step_sleep": 0.05,
              "fault": {"rank": trial.rank, "epoch": trial.epoch, "batch": trial.batch,
                        "how": "sigkill", "marker": str(tmp_path / "fault")}}
    stale = NodeCacheFS(str(tmp_path / "nfs-cache"), negative_ttl_s=30.0, slow_marks_s=1.2,
                        only_suffix=".commit.json", skip_instance_cache=True)
    run_storage = storage.run(name)
    saved = os.environ.get(NODE_ENV)
    os.environ[NODE_ENV] = "node0"  # the driver and its workers: one node's cache
    try:
        with StorageWatcher(run_storage) as watcher:
            result = TorchTrainer(
                jobs.train_mlp, train_loop_config=config,
                scaling_config=et.ScalingConfig(num_workers=2),
                run_config=et.RunConfig(
                    storage_path=storage.url, name=name, storage_filesystem=stale,
                    failure_config=et.FailureConfig(max_failures=1),
                    checkpoint_config=et.CheckpointConfig(num_to_keep=NUM_TO_KEEP)),
                datasets={"train": jobs.make_dataset()},
            ).fit()
    finally:
        if saved is None:
            os.environ.pop(NODE_ENV, None)
        else:
            os.environ[NODE_ENV] = saved
    return _outcome(result.return_value["digest"], run_storage, watcher, tmp_path)
