"""``report(checkpoint_upload_fn=...)``: the user's function that puts a checkpoint into
the run directory itself, run where Ray runs it.

Ray calls ``checkpoint_upload_fn(checkpoint, checkpoint_dir_name)`` in ``report()`` for
SYNC and in a background thread for ASYNC; so do we, on the rank's upload thread
(:mod:`elastic_train.storage.uploader`), as the job's first step: the function may
wait for a background writer (the guide's ``dcp.async_save`` future) without
blocking training. What it returns must be the run's directory of that name, on the
run's store; the rank's upload marker follows, and rank 0's commit reads the files
where they are. The reported directory is deleted afterwards when asked
(``delete_local_checkpoint_after_upload``), never when it is the checkpoint itself.

Example::

    write = writer(upload_fn, checkpoint, store, index, delete_local=False)
    job.write = write  # run by the upload thread before the rank's marker
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import Any

import fsspec

from elastic_train.checkpoint import Checkpoint
from elastic_train.errors import ConfigError
from elastic_train.storage import filesystem as fsutil
from elastic_train.storage.checkpoint_store import CheckpointStore


def writer(upload_fn: Callable[[Checkpoint, str], Checkpoint], checkpoint: Checkpoint,
           store: CheckpointStore, index: int, delete_local: bool) -> Callable[[], None]:
    """What the upload thread runs for checkpoint ``index`` of this rank: the function,
    the check of what it returned, then the deletion asked for."""
    def write() -> None:
        check_uploaded(upload_fn(checkpoint, store.name(index)), store.fs, store.path(index))
        if delete_local:
            shutil.rmtree(checkpoint.path, ignore_errors=True)

    return write


def check_uploaded(persisted: Any, fs: fsspec.AbstractFileSystem, expected: str) -> None:
    """A ConfigError unless ``checkpoint_upload_fn`` returned the checkpoint directory
    ``expected`` of the run, on the run's store (so that the commit, retention and
    resume find it where the checkpoint's name says)."""
    ok = isinstance(persisted, Checkpoint) and fsutil.same_store(persisted.filesystem, fs) and (
        os.path.realpath(persisted.path) == os.path.realpath(expected) if fsutil.is_local(fs)
        else persisted.path.rstrip("/") == expected)
    if not ok:
        raise ConfigError(
            f"report(checkpoint_upload_fn=...) returned {persisted!r}: write the files into "
            f"{fsutil.display_path(fs, expected)} (the run's directory named by the function's "
            "dir_name argument, or the run's directory you reported) and return a Checkpoint "
            "of that directory.")
