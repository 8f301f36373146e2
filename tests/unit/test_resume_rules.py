"""Resume rules without processes: which spec changes refuse a resume, which only warn,
and starting over -- the stored run moved aside whole, on local disk and on S3 (moto)."""

from __future__ import annotations

import logging

import pytest

from elastic_train.driver.resume_rules import TRAIN_FUNCTION_CHANGES, SpecChange, spec_changes
from elastic_train.driver.run_record import RunRecord
from elastic_train.errors import ConfigError, StorageError
from elastic_train.storage.run_state import RunState, RunStatus
from tests.conftest import make_storage

FIT = {"train_function": "jobs.train", "train_signature": "(config)",
       "scaling_config": {"num_workers": 2}}
LAUNCH = {"command": ["elastic-train", "launch", "train.py"], "identity": ["train.py", "--lr", "1"],
          "launch": {"nproc_per_node": 2, "nnodes": "1"}}


@pytest.mark.parametrize("stored, new, expected", [
    (FIT, FIT, []),
    (FIT, {**FIT, "train_function": "jobs.train_v2"},
     [SpecChange("train function", "jobs.train", "jobs.train_v2", True)]),
    (FIT, {**FIT, "train_signature": "()"},
     [SpecChange("train function signature", "(config)", "()", True)]),
    (FIT, {**FIT, "scaling_config": {"num_workers": 3}},
     [SpecChange("number of workers", 2, 3, False)]),
    ({"train_function": "jobs.train"}, FIT, []),  # a run.json of an older version
    (LAUNCH, {**LAUNCH, "identity": ["train.py", "--lr", "2"]},
     [SpecChange("script and arguments", ["train.py", "--lr", "1"], ["train.py", "--lr", "2"],
                 True)]),
    (LAUNCH, {**LAUNCH, "launch": {"nproc_per_node": 4, "nnodes": "1:2"},
              "identity": ["other.py"]},
     [SpecChange("script and arguments", ["train.py", "--lr", "1"], ["other.py"], True),
      SpecChange("--nproc-per-node", 2, 4, False), SpecChange("--nnodes", "1", "1:2", False)]),
])
def test_spec_changes(stored, new, expected):
    assert spec_changes(stored, new) == expected


def test_another_score_attribute_is_a_warning_that_says_what_it_means():
    stored = {**FIT, "checkpoint_config": {"checkpoint_score_attribute": "loss",
                                           "checkpoint_score_order": "min"}}
    new = {**FIT, "checkpoint_config": {"checkpoint_score_attribute": "acc",
                                        "checkpoint_score_order": "max"}}
    changes = spec_changes(stored, new)
    assert [(c.what, c.breaks) for c in changes] == [
        ("checkpoint_score_attribute", False), ("checkpoint_score_order", False)]
    assert "ranked anew" in changes[0].note


def test_a_train_function_passed_to_restore_is_accepted():
    new = {**FIT, "train_function": "jobs.other", "train_signature": "()"}
    assert spec_changes(FIT, new, TRAIN_FUNCTION_CHANGES) == []


def test_change_descriptions_name_both_sides():
    change = spec_changes(LAUNCH, {**LAUNCH, "identity": ["train.py", "--lr", "2"]})[0]
    assert change.describe() == "script and arguments: train.py --lr 1 -> train.py --lr 2"


def stored_run(storage, status="finished", spec=FIT):
    """A run as a driver leaves it: run.json, metrics and one checkpoint."""
    run = storage.run("run")
    run.ensure_writable()
    run.write_run_state(RunState.from_json({"name": "run", "status": status, "spec": spec,
                                            "launches": [{}], "failures": []}))
    storage.fs.pipe_file(f"{run.run_path}/metrics.jsonl", b'{"training_iteration": 1}\n')
    storage.fs.makedirs(f"{run.run_path}/checkpoint_000000", exist_ok=True)
    storage.fs.pipe_file(f"{run.run_path}/checkpoint_000000/state.pt", b"weights" * 100)
    return run


def files_under(fs, path):
    fs.invalidate_cache(path)
    return {name[len(path):]: fs.cat_file(name) for name in fs.find(path)}


@pytest.mark.parametrize("status, stored, new, words", [
    ("finished", FIT, FIT, ["has already finished", "RunConfig(start_over=True)",
                            "resume_from_checkpoint"]),
    ("finished", LAUNCH, LAUNCH, ["has already finished", "--start-over", "--name"]),
    ("interrupted", FIT, {**FIT, "train_function": "jobs.other"},
     ["train function: jobs.train -> jobs.other", "RunConfig(start_over=True)",
      "TorchTrainer.restore(path"]),
    ("running", LAUNCH, {**LAUNCH, "identity": ["train.py"]},
     ["script and arguments: train.py --lr 1 -> train.py", "--start-over",
      "elastic-train restore PATH"]),
])
def test_a_run_that_cannot_be_continued_is_refused_with_the_way_out(tmp_path, status, stored,
                                                                    new, words):
    storage = make_storage("local", tmp_path, None)
    run = stored_run(storage, status, stored)
    before = files_under(storage.fs, run.run_path)
    with pytest.raises(ConfigError) as info:
        RunRecord.begin(run, "run", new)
    assert all(w in str(info.value) for w in words), str(info.value)
    assert run.display_path in str(info.value)
    assert files_under(storage.fs, run.run_path) == before


def test_another_number_of_workers_is_resumed_with_a_warning(tmp_path, caplog):
    run = stored_run(make_storage("local", tmp_path, None), "interrupted")
    with caplog.at_level(logging.WARNING):
        record = RunRecord.begin(run, "run", {**FIT, "scaling_config": {"num_workers": 3}})
    assert len(record.state.launches) == 2
    assert "number of workers: 2 -> 3" in caplog.text and "bit-identically" in caplog.text


def test_start_over_moves_a_finished_run_aside_whole(storage, caplog):
    """Local disk: one rename. S3: copy, check the copy, delete (run.json last)."""
    run = stored_run(storage)
    before = files_under(storage.fs, run.run_path)
    with caplog.at_level(logging.WARNING):
        record = RunRecord.begin(run, "run", FIT, start_over=True)
    root = run.run_path.rsplit("/", 1)[0]
    archives = [p for p in storage.fs.ls(root, detail=False) if ".finished-" in p]
    assert len(archives) == 1 and archives[0].rsplit("/", 1)[1].startswith("run.finished-2")
    assert files_under(storage.fs, archives[0]) == before
    fresh = list(files_under(storage.fs, run.run_path))  # and the new launch's ledger line
    assert len(fresh) == 2 and fresh[0].startswith("/goodput/driver-") and fresh[1] == "/run.json"
    assert record.state.status is RunStatus.RUNNING and len(record.state.launches) == 1
    assert "moved to" in caplog.text


def test_start_over_continues_a_run_that_can_be_continued(tmp_path):
    storage = make_storage("local", tmp_path, None)
    run = stored_run(storage, "interrupted")
    record = RunRecord.begin(run, "run", FIT, start_over=True)
    assert len(record.state.launches) == 2
    assert storage.fs.ls(run.run_path.rsplit("/", 1)[0], detail=False) == [run.run_path]


def test_incomplete_copy_on_an_object_store_leaves_the_run_in_place(s3_endpoint, tmp_path,
                                                                     monkeypatch):
    storage = make_storage("s3", tmp_path, s3_endpoint)
    run = stored_run(storage)
    before = files_under(storage.fs, run.run_path)
    copy = run.fs.copy  # a copy cut short: the first file only
    monkeypatch.setattr(run.fs, "copy", lambda src, dst: copy(src[:1], dst[:1]))
    with pytest.raises(StorageError, match="incomplete set of files"):
        RunRecord.begin(run, "run", FIT, start_over=True)
    assert files_under(storage.fs, run.run_path) == before


def test_a_free_restart_after_a_peers_failure_is_not_told_as_no_restarts_left(tmp_path, caplog):
    """A node with no restarts of its own left still restarts after a peer's failure:
    the log said "no restart(s) left" just before it re-formed."""
    from elastic_train._internal.failure_kinds import FailureKind
    from elastic_train.agent.restart_budget import RestartBudget
    from elastic_train.errors import WorkerFailure

    record = RunRecord.begin(make_storage("local", tmp_path, None).run("run"), "run", FIT)
    failure = WorkerFailure(rank=0, local_rank=0, pid=1, exitcode=1, message="peer gone",
                            traceback=None)
    budget = RestartBudget(max_failures=0)
    with caplog.at_level(logging.WARNING):
        record.record_failure([failure], budget.charge(FailureKind.PEER))
        record.record_failure([failure], budget.charge(FailureKind.FAILURE))
    peer, own = (r.getMessage() for r in caplog.records[-2:])
    assert "restarting, not charged to this node (no restart(s) of its own left)" in peer
    assert own.endswith("; no restart left: the run stops.")


def test_a_re_form_after_a_lost_node_is_recorded_as_in_process(tmp_path):
    """A lost node: the agents rendezvous again (which closes the failure's time as for
    new processes), then hand the waiting workers their new ranks: the failure says
    in-process, and which rank got a new process."""
    from elastic_train._internal.failure_kinds import FailureKind
    from elastic_train.agent.restart_budget import RestartBudget
    from elastic_train.errors import WorkerFailure
    from elastic_train.storage.run_state import IN_PROCESS, NEW_PROCESSES

    run = make_storage("local", tmp_path, None).run("run")
    record = RunRecord.begin(run, "run", FIT)
    failure = WorkerFailure(rank=0, local_rank=0, pid=1, exitcode=1, message="peer gone",
                            traceback=None)
    record.record_failure([failure], RestartBudget(max_failures=2).charge(FailureKind.PEER))
    record.note_rendezvous()
    assert run.read_run_state().failures[-1].restart == NEW_PROCESSES
    record.note_recovery({1: "its process ended"})
    [recorded] = run.read_run_state().failures
    assert recorded.restart == IN_PROCESS and recorded.replaced == {1: "its process ended"}
    assert recorded.rendezvous_at is not None
