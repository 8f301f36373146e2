"""report()'s arguments under Ray 2.60's names: what each defaults to, and what is
refused, with the value and the way out, before any rank waits for another."""

from __future__ import annotations

import os

import pytest
from fsspec.implementations.local import LocalFileSystem

from elastic_train import Checkpoint, CheckpointUploadMode, ConfigError, ValidationTaskConfig
from elastic_train.worker.report_args import ReportArgs


def test_delete_local_defaults_to_true_for_an_async_asked_for(tmp_path):
    checkpoint = Checkpoint.from_directory(str(tmp_path))
    assert not ReportArgs.check({}, checkpoint).delete_local  # our ASYNC, where Ray's SYNC
    assert ReportArgs.check({}, checkpoint).mode is CheckpointUploadMode.ASYNC
    assert ReportArgs.check({}, checkpoint, mode="ASYNC").delete_local  # Ray's, asked for
    assert not ReportArgs.check({}, checkpoint, mode="SYNC").delete_local
    assert ReportArgs.check({}, checkpoint, mode="SYNC", delete_local=True).delete_local


def test_deleting_a_directory_that_holds_the_run_is_refused(tmp_path):
    checkpoint = Checkpoint.from_directory(str(tmp_path))
    with pytest.raises(ConfigError, match=r"would delete .*holds the run directory.*=False"):
        ReportArgs.check({}, checkpoint, mode="ASYNC",
                         run=(LocalFileSystem(), str(tmp_path / "results" / "run")))
    ReportArgs.check({}, checkpoint, delete_local=False,
                     run=(LocalFileSystem(), str(tmp_path / "run")))


@pytest.mark.parametrize("kwargs, match", [
    ({"dir_name": "a/b"}, r"checkpoint_dir_name='a/b'\) holds a path separator.*epoch_"),
    ({"dir_name": ".."}, r"checkpoint_dir_name='..'\) starts with '.'.*unique in the run"),
    ({"dir_name": ""}, r"checkpoint_dir_name=''\) is not a non-empty string"),
    ({"dir_name": "checkpoint_000004"}, r"is a default name, whose number another"),
    # a claim file "<index>.<name>.tmp-<hex>" must fit in 255 bytes (ENAMETOOLONG)
    ({"dir_name": "e" * 236}, r"'e{236}'\) is 236 bytes long.*over the 229 bytes"),
    ({"dir_name": "é" * 115}, r"is 230 bytes long \(UTF-8\), over the 229 bytes"),
    # the run directory's own entries
    ({"dir_name": "logs"}, r"checkpoint_dir_name='logs'\) is the name of one of the run "
                           r"directory's own entries \(departures, goodput, logs, metrics.jsonl"),
    ({"dir_name": "restores.json"}, r"'restores.json'\) is the name of one of the run"),
    ({"dir_name": "departures"}, r"'departures'\) is the name of one of the run"),
    ({"upload_fn": "s3://x"}, r"checkpoint_upload_fn='s3://x'\) must be a function"),
    ({"upload_fn": print, "mode": "NO_UPLOAD"}, r"NO_UPLOAD uploads nothing.*drop one"),
    ({"validation": True}, r"validation=True\): `validation_config` was not set on the "
                           r"trainer.*ValidationConfig\(fn\)"),
    ({"validation": "yes", "has_validation_fn": True},
     r"validation='yes'\): pass True.*ValidationTaskConfig"),
])
def test_what_is_not_supported_or_valid_is_refused_with_the_way_out(tmp_path, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        ReportArgs.check({"loss": 1.0}, Checkpoint.from_directory(str(tmp_path)), **kwargs)


def test_validation_without_a_checkpoint_is_refused_as_rays_is():
    with pytest.raises(ConfigError, match=r"validation=True\) needs a checkpoint"):
        ReportArgs.check({"loss": 1.0}, validation=True)


def test_validation_is_kept_as_asked_with_a_validation_fn(tmp_path):
    checkpoint = Checkpoint.from_directory(str(tmp_path))
    task = ValidationTaskConfig(fn_kwargs={"split": "val"})
    assert ReportArgs.check({}, checkpoint, validation=task,
                            has_validation_fn=True).validation is task
    assert ReportArgs.check({}, checkpoint, validation=True,
                            has_validation_fn=True).validation is True
    assert ReportArgs.check({}, checkpoint).validation is False


def test_an_upload_fn_given_a_directory_of_the_run_names_the_checkpoint_after_it(tmp_path):
    """Ray's guide: dcp.async_save writes into <run>/<epoch>, and the function reported
    with it waits for the save; the directory (maybe not made yet) is the checkpoint,
    so it is never deleted."""
    run = (LocalFileSystem(), str(tmp_path / "results" / "run"))
    inside = Checkpoint(str(tmp_path / "results" / "run" / "3"))
    args = ReportArgs.check({}, inside, mode="ASYNC", upload_fn=print, run=run)
    assert (args.in_run, args.dir_name, args.delete_local) == (True, "3", False)
    with pytest.raises(ConfigError, match=r"checkpoint_upload_fn\) would delete the checkpoint"):
        ReportArgs.check({}, inside, upload_fn=print, delete_local=True, run=run)
    with pytest.raises(ConfigError, match=r"checkpoint is the directory '3'"):
        ReportArgs.check({}, inside, "other", upload_fn=print, run=run)
    os.makedirs(tmp_path / "elsewhere")
    elsewhere = Checkpoint.from_directory(str(tmp_path / "elsewhere"))
    args = ReportArgs.check({}, elsewhere, mode="ASYNC", upload_fn=print, run=run)
    assert (args.in_run, args.dir_name, args.delete_local) == (False, None, True)


def test_a_bad_upload_mode_names_the_value():
    with pytest.raises(ConfigError, match=r"checkpoint_upload_mode='SOMETIMES'.*ASYNC"):
        ReportArgs.check({}, mode="SOMETIMES")


def test_no_upload_takes_a_directory_of_the_run_only(tmp_path):
    run = (LocalFileSystem(), str(tmp_path / "results" / "run"))
    inside = Checkpoint(str(tmp_path / "results" / "run" / "by_hand"))
    with pytest.raises(ConfigError, match=r"NO_UPLOAD\): there is no such directory"):
        ReportArgs.check({}, inside, mode="NO_UPLOAD", run=run)
    os.makedirs(inside.path)
    args = ReportArgs.check({}, inside, mode="NO_UPLOAD", run=run)
    assert (args.in_place, args.dir_name, args.delete_local) == (True, "by_hand", False)
    for outside in (tmp_path / "elsewhere", tmp_path / "results" / "run" / "a" / "b"):
        with pytest.raises(ConfigError, match=r"not a directory of the run .*report that"):
            ReportArgs.check({}, Checkpoint(str(outside)), mode="NO_UPLOAD", run=run)
    with pytest.raises(ConfigError, match=r"checkpoint is the directory 'by_hand'"):
        ReportArgs.check({}, inside, "other", mode="NO_UPLOAD", run=run)
    with pytest.raises(ConfigError, match=r"would delete the checkpoint .*itself"):
        ReportArgs.check({}, inside, mode="NO_UPLOAD", delete_local=True, run=run)
