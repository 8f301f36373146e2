"""Checkpoints on local disk survive a power cut at any step of their commit (#24, item 3):
a disk that keeps only what was fsynced (tests/support/power_cut.py) is cut after every
step of three commits with ``num_to_keep=1``, at every point its journal may have reached."""

from __future__ import annotations

import os

import pytest

from elastic_train.config import CheckpointConfig
from elastic_train.storage import CommitManifest, RunStorage
from elastic_train.storage.checkpoint_store import mismatched_files
from elastic_train.storage.uploader import CheckpointUploader, UploadJob
from elastic_train.worker.committer import Committer
from tests.support.power_cut import PowerCutDisk, materialize

FILES = ("model.pt", "optim/state.pt")


def report(tmp_path, index: int) -> str:
    """A worker's checkpoint directory for ``index`` (its files' bytes differ per index)."""
    source = tmp_path / f"report{index}"
    for rel in FILES:
        (source / rel).parent.mkdir(parents=True, exist_ok=True)
        (source / rel).write_bytes(f"{rel} of checkpoint {index} ".encode() * 100)
    return str(source)


def restore_problem(results: str, committed: int | None) -> str | None:
    """What is wrong with the run under ``results`` for a restore, if anything: the newest
    checkpoint with a marker must have intact files and be no older than ``committed``
    (the last commit that had returned before the cut)."""
    store = RunStorage.open(results, "run").checkpoints
    manifests = store.committed()
    if not manifests:
        return None if committed is None else f"no checkpoint left, {committed} was committed"
    newest = manifests[-1]
    if committed is not None and newest.index < committed:
        return f"newest checkpoint {newest.index}, {committed} was committed"
    if bad := mismatched_files(store.path(newest.index), newest):
        return f"checkpoint {newest.index} is committed over damaged files {bad}"
    return None


@pytest.mark.timeout(240)
def test_a_power_cut_at_any_step_of_a_commit_leaves_an_intact_checkpoint(tmp_path):
    results = str(tmp_path / "results")
    run = RunStorage.open(results, "run")
    run.ensure_writable()
    disk = PowerCutDisk(results, str(tmp_path / "inodes"))
    committer = Committer(run, CheckpointConfig(num_to_keep=1))
    uploader = CheckpointUploader(run.checkpoints, 0, str(tmp_path / "staging"),
                                  commit=committer.commit)
    done: list[tuple[int, int]] = []  # (the step after which, checkpoint) committed
    with disk.recording():
        for index in range(3):
            manifest = CommitManifest(index=index, training_iteration=index + 1, metrics={},
                                      files={}, world_size=1)
            uploader.submit(UploadJob(index, list(FILES), [0], manifest),
                            report(tmp_path, index))
            assert uploader.wait_for(index) is None
            done.append((disk.steps - 1, index))
        uploader.close()
    problems, seen = [], set()
    for cut in range(disk.steps):
        committed = max((i for step, i in done if step <= cut), default=None)
        for journal in range(cut + 1):
            tree = disk.after_cut(cut, journal)
            key = (committed, tuple(sorted(tree.items())))
            if key in seen:
                continue
            seen.add(key)
            copy = str(tmp_path / "cuts" / str(len(seen)))
            materialize(tree, copy)
            if problem := restore_problem(copy, committed):
                problems.append(f"cut after step {cut}, journal at {journal}: {problem}")
    assert len(seen) > 10 and os.listdir(tmp_path / "cuts")
    assert not problems, f"{len(problems)} of {len(seen)} cuts: " + "; ".join(problems[:3])


def test_the_power_cut_trial_draws_among_every_step_of_a_commit(tmp_path):
    """The chaos kind ``power_cut_commit`` cuts at step ``k < STEPS_PER_COMMIT`` of a commit
    (counted from the first step that names its directory) of its job, whose checkpoints
    are one file: that must be every step of a commit that retires a checkpoint
    (``num_to_keep=2``), the longest kind; one that retires none makes 4 fewer."""
    from tests.support.power_cut_job import NUM_TO_KEEP, STEPS_PER_COMMIT

    run = RunStorage.open(str(tmp_path / "results"), "run")
    run.ensure_writable()
    disk = PowerCutDisk(run.run_path, str(tmp_path / "inodes"))
    committer = Committer(run, CheckpointConfig(num_to_keep=NUM_TO_KEEP))
    uploader = CheckpointUploader(run.checkpoints, 0, str(tmp_path / "staging"),
                                  commit=committer.commit)
    ends = []
    with disk.recording():
        for index in range(3):
            source = tmp_path / f"state{index}"
            source.mkdir()
            (source / "state.pt").write_bytes(b"weights %d" % index)
            manifest = CommitManifest(index=index, training_iteration=index + 1, metrics={},
                                      files={}, world_size=1)
            uploader.submit(UploadJob(index, ["state.pt"], [0], manifest), str(source))
            assert uploader.wait_for(index) is None
            ends.append(disk.steps)
        uploader.close()
    commit = disk.ops[ends[1]:ends[2]]
    assert commit[0] == "mkdir checkpoint_000002"
    assert commit[-1] == "rmdir checkpoint_000000"  # retention's delete, the last step
    assert len(commit) == STEPS_PER_COMMIT, commit
    assert len(disk.ops[ends[0]:ends[1]]) == STEPS_PER_COMMIT - 4
