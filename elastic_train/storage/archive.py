"""Moving a run directory aside, whole, before its name is used for a new run.

``RunConfig(start_over=True)`` / ``--start-over`` never delete a stored run:
it is moved to ``<name>.<status>-<UTC time>`` first. On local disk and NFS
that is one atomic rename. On object stores there is no rename (s3fs's ``mv``
is a copy then a delete, and can fail half-way), so the run is copied, the
copy is checked to hold every file at its size, and only then is the original
deleted -- ``run.json`` last, so a deletion cut short still leaves a run
directory that says what it is, and is archived again (never lost) next time.
"""

from __future__ import annotations

import time

from elastic_train.errors import StorageError
from elastic_train.storage import filesystem as fsutil
from elastic_train.storage.run_state import RUN_FILE
from elastic_train.storage.run_storage import RunStorage


def archive_path(storage: RunStorage, status: str, now: float | None = None) -> str:
    """``<run_path>.<status>-<UTC time>``, e.g. ``digits.finished-20261123T002040Z``;
    a ``-2``, ``-3``... suffix if that name is taken."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    base = f"{storage.run_path}.{status}-{stamp}"
    path, n = base, 1
    while storage.fs.exists(path):
        n += 1
        path = f"{base}-{n}"
    return path


def archive_run(storage: RunStorage, status: str) -> str:
    """Moves the run directory to :func:`archive_path`; returns the archive's display path.

    Example::

        where = archive_run(RunStorage.open("/tmp/results", "digits"), "finished")
    """
    target = archive_path(storage, status)
    if not storage.adapter.rename_tree(storage.run_path, target):
        _copy_then_delete(storage, target)
    return fsutil.display_path(storage.fs, target)


def _listing(storage: RunStorage, path: str) -> dict[str, int]:
    """``{path relative to path: size}`` of every file below ``path``."""
    def find() -> dict[str, dict]:
        storage.fs.invalidate_cache(path)
        return storage.fs.find(path, detail=True)

    found = storage.retry.call("listing", fsutil.display_path(storage.fs, path), find)
    return {name[len(path):].lstrip("/"): info.get("size") for name, info in found.items()}


def _copy_then_delete(storage: RunStorage, target: str) -> None:
    fs, source = storage.fs, storage.run_path
    files = _listing(storage, source)
    where = storage.display_path
    storage.retry.call("archiving (copy)", where, lambda: fs.copy(
        [fsutil.join(source, rel) for rel in files],
        [fsutil.join(target, rel) for rel in files]))
    copied = _listing(storage, target)
    missing = sorted(rel for rel, size in files.items() if copied.get(rel) != size)
    if missing:
        raise StorageError(
            f"Archiving {where} to {fsutil.display_path(fs, target)} copied an incomplete set "
            f"of files (missing or of another size: {', '.join(missing[:5])}); the run is "
            "left where it was. Try again, or move it aside yourself.")
    last = [rel for rel in files if rel == RUN_FILE]
    for batch in ([rel for rel in files if rel != RUN_FILE], last):
        if batch:
            storage.retry.call("archiving (delete)", where, lambda b=batch: fs.rm(
                [fsutil.join(source, rel) for rel in b]))
    fs.invalidate_cache(source)
