"""The restore decision, without processes: fed manifests and metric rows."""


from elastic_train.storage import CommitManifest, RunStorage
from elastic_train.storage.checkpoint_store import scan_directory
from elastic_train.storage.retention import CheckpointRecord
from elastic_train.worker.control_group import ControlGroup
from elastic_train.worker.resume_point import (
    agree_on_resume_point,
    decide_resume_point,
    load_resume_point,
)


def manifest(index, iteration, world_size=2, states=None):
    return CommitManifest(index=index, training_iteration=iteration, metrics={"i": index},
                          files={}, world_size=world_size, worker_states=states or {})


def rows(n, seconds_each=2.0):
    return [{"training_iteration": i, "time_total_s": i * seconds_each} for i in range(1, n + 1)]


def always(_):
    return True


def test_first_start_resumes_nothing():
    point = decide_resume_point([], [], always)
    assert (point.manifest, point.next_index, point.time_before_restore_s) == (None, 0, 0.0)
    assert point.kept_rows == [] and not point.is_restart
    assert point.training_iteration == 0 and point.restart_entry(5.0) is None


def test_newest_intact_checkpoint_and_the_rows_up_to_it():
    manifests = [manifest(0, 2), manifest(1, 4), manifest(2, 6)]
    point = decide_resume_point(manifests, rows(7), always)
    assert point.manifest.index == 2 and point.training_iteration == 6
    assert [r["training_iteration"] for r in point.kept_rows] == [1, 2, 3, 4, 5, 6]
    assert point.next_index == 3
    assert point.time_before_restore_s == 12.0
    assert (point.recomputed_iterations, point.recomputed_s) == (1, 2.0)
    assert point.committed == tuple(CheckpointRecord(i, {"i": i}) for i in range(3))
    assert point.restart_entry(99.0).to_json() == {
        "time": 99.0, "restored_iteration": 6, "recomputed_iterations": 1, "recomputed_s": 2.0}


def test_a_damaged_checkpoint_falls_back_and_older_ones_are_not_checked():
    asked = []

    def intact(m):
        asked.append(m.index)
        return m.index != 2

    manifests = [manifest(0, 2), manifest(1, 4), manifest(2, 6)]
    point = decide_resume_point(manifests, rows(6), intact)
    assert point.manifest.index == 1 and asked == [2, 1]
    assert point.next_index == 3  # the damaged one's index is never reused
    assert (point.recomputed_iterations, point.recomputed_s) == (2, 4.0)


def test_a_committed_checkpoint_whose_row_was_never_recorded_brings_it_back():
    """A SYNC report commits, then fails before rank 0 appends its row (a peer died while
    the ranks agreed on the upload): the manifest's row fills the history's hole."""
    row = {"training_iteration": 5, "time_total_s": 10.0, "checkpoint_dir_name": "c4"}
    newest = CommitManifest(index=4, training_iteration=5, metrics=row, files={},
                            world_size=2)
    point = decide_resume_point([manifest(3, 4), newest], rows(4), always)
    assert [r["training_iteration"] for r in point.kept_rows] == [1, 2, 3, 4, 5]
    assert point.kept_rows[-1] == row and point.kept_rows[-1] is not row
    assert (point.time_before_restore_s, point.recomputed_iterations) == (10.0, 0)
    # recorded already: kept once
    recorded = decide_resume_point([manifest(3, 4), newest], [*rows(4), row], always)
    assert [r["training_iteration"] for r in recorded.kept_rows] == [1, 2, 3, 4, 5]


def test_no_intact_checkpoint_drops_every_row():
    point = decide_resume_point([manifest(0, 2)], rows(3), lambda m: False)
    assert point.manifest is None and point.kept_rows == [] and point.is_restart
    assert (point.time_before_restore_s, point.recomputed_iterations) == (0.0, 3)


def test_a_crash_before_the_first_checkpoint_is_a_restart():
    point = decide_resume_point([], rows(2), always)
    assert point.is_restart and point.next_index == 0
    assert point.restart_entry(1.0).recomputed_iterations == 2


def test_removed_uncommitted_directories_are_never_reused():
    assert decide_resume_point([manifest(0, 2)], rows(2), always, removed=[5]).next_index == 6


def test_rows_without_time_count_as_none():
    point = decide_resume_point([manifest(0, 1)], [{"training_iteration": 1}, {"x": 1}], always)
    assert point.time_before_restore_s == 0.0 and point.recomputed_s == 0.0
    assert len(point.kept_rows) == 2  # a row without an iteration counts as iteration 0


def test_what_the_other_ranks_get_leaves_rank_0s_history_out():
    point = decide_resume_point([manifest(0, 2)], rows(3), always)
    shared = point.for_every_rank()
    assert (shared.manifest, shared.next_index, shared.time_before_restore_s) == \
        (point.manifest, point.next_index, point.time_before_restore_s)
    assert shared.kept_rows == [] and shared.committed == ()


def test_load_trims_the_stored_history_and_records_the_restart(tmp_path):
    """The thin I/O around the decision: leftovers removed, metrics.jsonl rewritten."""
    run = RunStorage.open(str(tmp_path), "run")
    src = tmp_path / "src"
    src.mkdir()
    (src / "state.pt").write_bytes(b"state")
    for index in (0, 1):
        run.checkpoints.upload(index, str(src), ["state.pt"])
    run.checkpoints.commit(CommitManifest(0, 2, {}, scan_directory(str(src)), 2))
    run.write_metrics(rows(3))
    removed, manifests = run.checkpoints.sweep()
    point = load_resume_point(run, 2, manifests, manifests[0], removed)
    assert point.manifest.index == 0 and point.next_index == 2
    assert run.read_metrics() == rows(2)
    assert not run.fs.exists(run.checkpoints.path(1))
    [entry] = run.read_restores()
    assert entry.recomputed_iterations == 1 and entry.restored_iteration == 2


def test_one_rank_agrees_with_itself_and_skips_a_damaged_checkpoint(tmp_path):
    """The whole agreement with a group of one (no process group): sweep, check, decide."""
    run = RunStorage.open(str(tmp_path), "run")
    for index in (0, 1, 2):
        src = tmp_path / f"src{index}"  # one each: local uploads are hard links
        src.mkdir()
        (src / "state.pt").write_bytes(b"state %d" % index)
        run.checkpoints.upload(index, str(src), ["state.pt"])
        if index < 2:  # 2 is never committed
            run.checkpoints.commit(CommitManifest(index, index + 1, {},
                                                  scan_directory(str(src)), 1))
    run.write_metrics(rows(3))
    (tmp_path / "run" / "checkpoint_000001" / "state.pt").write_bytes(b"rotten!")
    point = agree_on_resume_point(run, ControlGroup(1), rank=0)
    assert point.manifest.index == 0 and point.next_index == 3
    assert run.read_metrics() == rows(1)
    # the damaged one is set aside (its name free again), out of retention's records
    assert [m.index for m in run.checkpoints.committed()] == [0]
    assert [r.index for r in point.committed] == [0]
    assert (tmp_path / "run" / ".damaged" / "000001.checkpoint_000001" / "state.pt").exists()
    assert agree_on_resume_point(run, ControlGroup(1), rank=0).next_index == 2
