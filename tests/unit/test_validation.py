"""Asynchronous validation without a trainer: Ray's config types and how a report's
``validation`` resolves, retention of pending checkpoints, the committer's record of an
outcome (manifest, metrics.jsonl row, re-ranking), the runner's real processes
(validated, failed, timed out, abandoned) and the statuses listed."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from fsspec.implementations.local import LocalFileSystem

from elastic_train import (
    CheckpointConfig,
    ConfigError,
    ReportedCheckpointStatus,
    ValidationConfig,
    ValidationTaskConfig,
)
from elastic_train.agent.worker_slots import surviving
from elastic_train.errors import CorruptManifestError
from elastic_train.storage import CheckpointStore, CommitManifest
from elastic_train.storage.checkpoint_store import MARKER, scan_directory
from elastic_train.storage.retention import CheckpointRecord, to_delete
from elastic_train.storage.retry import RetryPolicy
from elastic_train.validation_config import check_validation
from elastic_train.worker.reported_checkpoints import reported_checkpoints, status_of
from elastic_train.worker.validation_runner import Outcome, ValidationRunner
from tests.conftest import REPO, committer_for, wait_until
from tests.support.process_tree import child_pids
from tests.support.validation_functions import starts_processes


def _score(checkpoint, offset=0.0, sleep_s=0.0, fail=False):
    """A validation function the runner's processes import by name."""
    if fail:
        raise RuntimeError("no validation data")
    time.sleep(sleep_s)
    with open(os.path.join(checkpoint.path, "a.pt"), "rb") as f:
        return {"val": len(f.read()) + offset, "validator_pid": os.getpid()}


def _environment(checkpoint):
    """A validation function that returns what its process was given."""
    return {"visible": os.environ.get("CUDA_VISIBLE_DEVICES", "unset"),
            "home": os.environ.get("HF_HOME", "unset")}


# config types
def test_task_config_defaults_and_bad_values_as_rays():
    assert ValidationTaskConfig() == ValidationTaskConfig(fn_kwargs={}, timeout_s=None)
    for bad, match in (({"timeout_s": 0}, r"timeout_s=0\).*> 0, or None"),
                       ({"timeout_s": True}, r"timeout_s=True"),
                       ({"fn_kwargs": [1]}, r"fn_kwargs=\[1\]\) must be a dict"),
                       ({"fn_kwargs": {"data": object()}}, r"JSON-serialisable.*paths")):
        with pytest.raises(ConfigError, match=match):
            ValidationTaskConfig(**bad)


def test_config_checks_fn_and_ray_remote_kwargs():
    with pytest.raises(ConfigError, match=r"fn=3\) is not callable"):
        ValidationConfig(3)
    with pytest.raises(ConfigError, match=r"task_config=\{\}\) must be a ValidationTaskConfig"):
        ValidationConfig(_score, task_config={})
    with pytest.raises(ConfigError, match=r"ray_remote_kwargs=\[1\]\) must be a dict"):
        ValidationConfig(_score, ray_remote_kwargs=[1])
    assert ValidationConfig(_score, ray_remote_kwargs=None).task_config == ValidationTaskConfig()


def test_a_reports_validation_resolves_as_rays():
    config = ValidationConfig(_score, ValidationTaskConfig({"offset": 1, "sleep_s": 2},
                                                           timeout_s=30))
    assert config.task(True) == {"fn_kwargs": {"offset": 1, "sleep_s": 2}, "timeout_s": 30}
    # a report's kwargs win key by key; its timeout_s is its own, None included (Ray's)
    assert config.task(ValidationTaskConfig({"offset": 5})) == {
        "fn_kwargs": {"offset": 5, "sleep_s": 2}, "timeout_s": None}
    assert check_validation(False) is False and check_validation(None) is False
    with pytest.raises(ConfigError, match=r"validation=1\): pass True"):
        check_validation(1)


# retention
def test_retention_keeps_what_waits_for_its_validation():
    cfg = CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="val")
    records = [CheckpointRecord(0, {"val": 1.0}), CheckpointRecord(1, {}),
               CheckpointRecord(2, {"val": 0.5}), CheckpointRecord(3, {})]
    assert to_delete(records, cfg) == [1, 2]  # 0 the best, 3 the latest
    assert to_delete(records, cfg, pending={1}) == [2]


# the committer's record of an outcome
@pytest.fixture
def store(tmp_path):
    return CheckpointStore(LocalFileSystem(), str(tmp_path / "run"), RetryPolicy(budget_s=2))


class _Runner:
    def __init__(self):
        self.submitted = []

    def submit(self, manifest):
        self.submitted.append(manifest)


def _commit(committer, store, tmp_path, index, metrics, task=None):
    src = tmp_path / f"src{index}"
    src.mkdir()
    (src / "a.pt").write_bytes(b"a" * (10 + index))
    store.upload(index, str(src), ["a.pt"])
    store.uploads.mark_uploaded(index, 0, scan_directory(str(src)))
    row = {"training_iteration": index + 1, "checkpoint_dir_name": f"checkpoint_{index:06d}",
           **metrics}
    manifest = committer.manifest(index, row, [{}], task)
    committer.record_row(row)
    committer.commit(manifest, [0])
    return manifest


def test_an_outcome_lands_in_the_manifest_and_the_row_then_retention_ranks(store, tmp_path):
    config = CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="val")
    committer = committer_for(store, config)
    committer.validations = runner = _Runner()
    task = {"fn_kwargs": {}, "timeout_s": None}
    first = _commit(committer, store, tmp_path, 0, {"loss": 1.0}, task)
    second = _commit(committer, store, tmp_path, 1, {"loss": 2.0}, task)
    _commit(committer, store, tmp_path, 2, {"loss": 3.0, "val": 0.1})
    assert runner.submitted == [first, second]
    # both pending: kept although neither has a score (and only one may be kept)
    assert [(m.index, status_of(m).value) for m in store.committed()] == [
        (0, "PENDING_VALIDATION"), (1, "PENDING_VALIDATION"), (2, "COMMITTED")]
    committer.finish_validation(first, Outcome("VALIDATED", {"val": 0.9, "loss": -1.0}))
    committer.finish_validation(second, Outcome("VALIDATION_FAILED", {}, "Traceback: boom"))
    # 0 is the best by its validation; 2 the latest; 1 (failed, no score) goes
    by_index = {m.index: m for m in store.committed()}
    assert sorted(by_index) == [0, 2]
    assert by_index[0].metrics["val"] == 0.9 and by_index[0].metrics["loss"] == -1.0
    assert by_index[0].validation == {"status": "VALIDATED", "task": task}
    rows = [json.loads(line) for line in open(f"{store.run_path}/metrics.jsonl")]
    assert [(r.get("val"), r["loss"]) for r in rows] == [(0.9, -1.0), (None, 2.0), (0.1, 3.0)]
    listed = reported_checkpoints(store, config)
    assert [(r.metrics["training_iteration"], r.status) for r in listed] == [
        (3, ReportedCheckpointStatus.COMMITTED), (1, ReportedCheckpointStatus.VALIDATED)]


class _Crash(BaseException):
    """The process dies here."""


@pytest.mark.parametrize("crash_at", ["metrics.jsonl", "marker"])
def test_a_crash_while_an_outcome_is_recorded_leaves_it_to_be_validated_again(
        store, tmp_path, monkeypatch, crash_at):
    """Never a VALIDATED marker without its metrics in ``metrics.jsonl``: the rows are
    written first, so a crash before the marker leaves the checkpoint pending, and the
    next attempt validates it again."""
    committer = committer_for(store)
    committer.validations = _Runner()
    task = {"fn_kwargs": {}, "timeout_s": None}
    manifest = _commit(committer, store, tmp_path, 0, {"loss": 1.0}, task)

    def crash(*args):
        raise _Crash

    if crash_at == "marker":
        monkeypatch.setattr(store, "commit", crash)
    else:
        monkeypatch.setattr(committer.storage, "write_metrics", crash)
    with pytest.raises(_Crash):
        committer.finish_validation(manifest, Outcome("VALIDATED", {"val": 0.9}))
    [marker] = CheckpointStore(store.fs, store.run_path).committed()
    [row] = [json.loads(line) for line in open(f"{store.run_path}/metrics.jsonl")]
    assert status_of(marker) is ReportedCheckpointStatus.PENDING_VALIDATION
    assert row.get("val") == (0.9 if crash_at == "marker" else None)
    again = committer_for(CheckpointStore(store.fs, store.run_path))
    again.validations = runner = _Runner()
    runner.requeue = runner.submitted.extend
    again.requeue_validations()
    assert [m.index for m in runner.submitted] == [0]


def test_a_restarted_attempt_takes_the_pending_validations_again(store, tmp_path):
    committer = committer_for(store)
    committer.validations = _Runner()
    task = {"fn_kwargs": {"offset": 1}, "timeout_s": 5}
    _commit(committer, store, tmp_path, 0, {"loss": 1.0}, task)
    _commit(committer, store, tmp_path, 1, {"loss": 1.0})
    again = committer_for(store)
    again.validations = runner = _Runner()
    runner.requeue = runner.submitted.extend
    again.requeue_validations()
    assert [(m.index, m.validation["task"]) for m in runner.submitted] == [(0, task)]


def test_a_marker_with_a_bad_validation_is_damaged(store, tmp_path):
    manifest = CommitManifest(index=0, training_iteration=1, metrics={}, files={},
                              world_size=1, validation={"status": "DONE"})
    with pytest.raises(CorruptManifestError, match="validation="):
        CommitManifest.from_json(json.loads(json.dumps(manifest.__dict__)))


# the runner's processes
def _runner(store, tmp_path, outcomes, **defaults):
    return ValidationRunner(ValidationConfig(_score, ValidationTaskConfig(**defaults)), store,
                            lambda m, o: outcomes.append((m.index, o)),
                            str(tmp_path / "scratch"))


def _committed(store, tmp_path, index, task):
    src = tmp_path / f"c{index}"
    src.mkdir()
    (src / "a.pt").write_bytes(b"a" * 10)
    store.upload(index, str(src), ["a.pt"])
    manifest = CommitManifest(index=index, training_iteration=index + 1, metrics={},
                              files=scan_directory(str(src)), world_size=1,
                              validation={"status": "PENDING_VALIDATION", "task": task})
    store.commit(manifest)
    return manifest


def test_the_runner_validates_each_checkpoint_in_a_process_of_its_own(store, tmp_path):
    outcomes = []
    runner = _runner(store, tmp_path, outcomes)
    runner.submit(_committed(store, tmp_path, 0, {"fn_kwargs": {"offset": 0.5},
                                                  "timeout_s": None}))
    runner.submit(_committed(store, tmp_path, 1, {"fn_kwargs": {"fail": True},
                                                  "timeout_s": None}))
    runner.submit(_committed(store, tmp_path, 2, {"fn_kwargs": {"sleep_s": 30},
                                                  "timeout_s": 0.5}))
    began = time.monotonic()
    runner.close()  # waits for all three, in order
    assert time.monotonic() - began < 25  # the 30 s one was killed at its timeout
    (i0, ok), (i1, failed), (i2, slow) = outcomes
    assert (i0, ok.status, ok.metrics["val"]) == (0, "VALIDATED", 10.5)
    assert ok.metrics["validator_pid"] != os.getpid()
    assert failed.status == "VALIDATION_FAILED"
    assert "RuntimeError: no validation data" in failed.error
    assert (slow.status, slow.error) == ("VALIDATION_TIMEOUT", "exceeded timeout_s=0.5 s")
    assert os.listdir(tmp_path / "scratch") == []
    assert os.path.exists(f"{store.path(0)}/{MARKER}")


@pytest.mark.parametrize(("visible", "num_gpus", "expected"), [
    ("4,5,6,7", 1, "5"),     # rank 0's cuda:1 is the node's 5th visible device
    (None, 2, "2,3"),       # rank 0 holds cuda:2 and cuda:3, both given
    ("4,5,6,7", 0, "4,5,6,7"),  # no num_gpus: what rank 0's worker sees
])
def test_the_validation_process_sees_rank_0s_gpus_and_the_env_vars_asked_for(
        store, tmp_path, monkeypatch, visible, num_gpus, expected):
    """Ray's ray_remote_kwargs={"num_gpus": n, "runtime_env": {"env_vars": ...}}, in the
    validation's own process (no CUDA call: the variable is what it is given)."""
    import torch

    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    config = ValidationConfig(_environment, ray_remote_kwargs={
        "num_gpus": num_gpus, "runtime_env": {"env_vars": {"HF_HOME": "/data/hf"}}})
    devices = [torch.device("cuda", 1)] if visible else [torch.device("cuda", i) for i in (2, 3)]
    outcomes = []
    runner = ValidationRunner(config, store, lambda m, o: outcomes.append(o),
                              str(tmp_path / "scratch"), devices)
    runner.submit(_committed(store, tmp_path, 0, {"fn_kwargs": {}, "timeout_s": None}))
    runner.close()
    assert outcomes[0].metrics == {"visible": expected, "home": "/data/hf"}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sleep_s, timeout_s, status", [
    (60.0, 8.0, "VALIDATION_TIMEOUT"),  # killed at its timeout
    (0.0, None, "VALIDATED"),  # returned, its processes still running
])
def test_what_a_validation_started_dies_with_it(store, tmp_path, sleep_s, timeout_s, status):
    outcomes, pid_file = [], tmp_path / "pids"
    runner = ValidationRunner(ValidationConfig(starts_processes), store,
                              lambda m, o: outcomes.append(o), str(tmp_path / "scratch"))
    runner.submit(_committed(store, tmp_path, 0, {"timeout_s": timeout_s, "fn_kwargs": {
        "pid_file": str(pid_file), "sleep_s": sleep_s}}))
    try:
        runner.close()
        assert [o.status for o in outcomes] == [status]
        started = [int(p) for p in pid_file.read_text().split()]
        assert surviving(started, wait_s=5) == {}, "processes left behind"
    finally:
        with contextlib.suppress(OSError, ValueError):
            for pid in map(int, pid_file.read_text().split()):
                os.kill(pid, signal.SIGKILL)


_OWNER = """
import sys, time
from fsspec.implementations.local import LocalFileSystem
from elastic_train import ValidationConfig
from elastic_train.storage import CheckpointStore
from elastic_train.worker.validation_runner import ValidationRunner
from tests.support.validation_functions import starts_processes
store = CheckpointStore(LocalFileSystem(), sys.argv[1])
ValidationRunner(ValidationConfig(starts_processes), store, print, sys.argv[2]).submit(
    store.committed()[0])
time.sleep(120)
"""


@pytest.mark.timeout(60)
def test_what_a_validation_started_dies_with_the_worker_that_started_it(store, tmp_path):
    """The worker (here a process running a runner) is SIGKILLed mid-validation: the
    validation process ends, and so does every process it started."""
    pid_file = tmp_path / "pids"
    _committed(store, tmp_path, 0, {"timeout_s": None, "fn_kwargs": {
        "pid_file": str(pid_file), "sleep_s": 120.0}})
    owner = subprocess.Popen([sys.executable, "-c", _OWNER, store.run_path,
                              str(tmp_path / "scratch")], cwd=REPO,
                             env={**os.environ, "PYTHONPATH": REPO})
    started = []
    try:
        assert wait_until(lambda: pid_file.exists() and pid_file.read_text(), 30)
        started = [int(p) for p in pid_file.read_text().split()]
        validation = child_pids(owner.pid)
        assert len(validation) == 1
    finally:
        owner.kill()
        owner.wait()
    try:
        assert surviving(validation + started, wait_s=10) == {}, "processes left behind"
    finally:
        for pid in started:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def test_an_abandoned_runner_kills_its_validation_and_records_nothing(store, tmp_path):
    outcomes = []
    runner = _runner(store, tmp_path, outcomes)
    runner.submit(_committed(store, tmp_path, 0, {"fn_kwargs": {"sleep_s": 30},
                                                  "timeout_s": None}))
    time.sleep(0.5)
    began = time.monotonic()
    runner.abandon()
    assert time.monotonic() - began < 5
    runner.submit(_committed(store, tmp_path, 1, {"fn_kwargs": {}, "timeout_s": None}))
    runner.close()
    assert outcomes == []
