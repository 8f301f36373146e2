"""``elastic-train ls`` and ``show``: read run directories, never change them.

They read the run directory only (no torch import: they start in a fraction
of a second). What they cannot read is said in one line with what to check:
a path that does not exist, a store that refuses (credentials, a bucket, an
endpoint: the store's adapter knows what to suggest), a run.json that is not
a run record (``ls`` skips it with a warning, ``show`` explains it).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import time
from collections.abc import Iterator

import fsspec

from elastic_train.cli import render, run_plot
from elastic_train.cli.run_summary import RunSummary
from elastic_train.driver.run_lease import held_by_a_live_job
from elastic_train.errors import ConfigError, StorageError
from elastic_train.storage import RunStorage
from elastic_train.storage import filesystem as fsutil
from elastic_train.storage.run_state import RunState, RunStatus
from elastic_train.storage.stores import adapter_for


@contextlib.contextmanager
def reading(fs: fsspec.AbstractFileSystem, path: str) -> Iterator[None]:
    """Any error of the store while reading ``path`` as one StorageError saying what to
    check (a botocore or fsspec traceback says nothing to a user)."""
    try:
        yield
    except (ConfigError, StorageError):
        raise
    except FileNotFoundError:
        raise StorageError(f"{fsutil.display_path(fs, path)} does not exist; check the "
                           "path") from None
    except Exception as exc:  # the store's own error types vary (botocore, OSError, ...)
        raise StorageError(f"cannot read {fsutil.display_path(fs, path)} "
                           f"({type(exc).__name__}: {exc}); {adapter_for(fs).access_hint}"
                           ) from exc


def check_directory(fs: fsspec.AbstractFileSystem, path: str, what: str) -> None:
    """``path`` must be an existing directory: ``what`` it should be (``"a run directory"``,
    ``"a storage path"``) names the fix when it is missing or a file (a run.json given
    for its run: its directory)."""
    with reading(fs, path):
        if not fs.exists(path):
            raise FileNotFoundError(path)
        if fs.isdir(path):
            return
    shown = fsutil.display_path(fs, path)
    parent = fsutil.display_path(fs, path.rstrip("/").rpartition("/")[0] or "/")
    if what == "a storage path":
        fix = ("pass the directory that holds the runs (the storage path they were "
               f"started with), e.g. {parent}")
    else:
        fix = (f"pass the run's directory{f', {parent}' if shown.endswith('/run.json') else ''}"
               " (`elastic-train ls STORAGE_PATH` lists them)")
    raise StorageError(f"{shown} is a file, not {what}: {fix}")


def _runs(fs: fsspec.AbstractFileSystem, root: str) -> list[tuple[str, RunStorage, RunState]]:
    """The runs under ``root``, oldest first; an unreadable run.json is skipped with a
    warning."""
    check_directory(fs, root, "a storage path")
    with reading(fs, root):
        entries = fs.ls(root, detail=True)
    runs = []
    for entry in entries:
        if entry["type"] != "directory":
            continue
        storage = RunStorage(fs, entry["name"])
        try:
            with reading(fs, entry["name"]):
                state = storage.read_run_state()
                state = state and _as_it_stands(storage, state)
        except StorageError as exc:
            print(render.printed([f"elastic-train: skipping {storage.display_path}: {exc}"]),
                  file=sys.stderr)
            continue
        if state is not None:
            runs.append((entry["name"].rstrip("/").rsplit("/", 1)[-1], storage, state))
    return sorted(runs, key=lambda r: r[2].created)


def _as_it_stands(storage: RunStorage, state: RunState) -> RunState:
    """``state``, with a ``running`` run whose job is gone (its driver killed with
    SIGKILL, its node lost: nothing wrote its end) shown as ``interrupted``, as its
    lease tells."""
    if state.status is RunStatus.RUNNING and held_by_a_live_job(storage) is False:
        gone = RunStatus.INTERRUPTED
        launches = [dataclasses.replace(launch, status=gone)
                    if launch.status is RunStatus.RUNNING else launch
                    for launch in state.launches]
        return dataclasses.replace(state, status=gone, launches=launches)
    return state


def _summary(storage: RunStorage, state: RunState) -> RunSummary:
    """The run's summary for ``ls``; one whose files cannot be read is listed as damaged
    (why: on stderr), so that one odd run hides none of the others."""
    try:
        with reading(storage.fs, storage.run_path):
            return RunSummary.read(storage, state)
    except (ConfigError, StorageError) as exc:
        print(render.printed([f"elastic-train: {storage.display_path} is damaged: {exc}"]),
              file=sys.stderr)
        return RunSummary.unreadable(str(exc))


def cmd_ls(args: argparse.Namespace) -> int:
    fs, root = fsutil.resolve(args.storage_path,
                              options=fsutil.options_from_flags(args.storage_option))
    runs = [(name, state, _summary(storage, state)) for name, storage, state in _runs(fs, root)]
    if args.json:
        print(render.runs_json(runs))
    elif not runs:
        print(render.printed([f"No runs under {fsutil.display_path(fs, root)}"]))
    else:
        print(render.printed(render.runs_table(runs, time.time())))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    fs, path = fsutil.resolve(args.run_path,
                              options=fsutil.options_from_flags(args.storage_option))
    storage = RunStorage(fs, path)
    plot_format = run_plot.check_output(args.plot) if args.plot else None
    check_directory(fs, path, "a run directory")
    with reading(fs, path):
        state = storage.read_run_state()
        if state is None:
            raise StorageError(f"{storage.display_path} is not a run directory (no run.json); "
                               "pass a run's directory, as `elastic-train ls` lists them")
        state = _as_it_stands(storage, state)
        summary = RunSummary.read(storage, state)
        drawn = run_plot.draw(storage, state, summary) if plot_format else None
    if plot_format:  # outside `reading`: an error of the output path is not the run's
        run_plot.save(drawn, args.plot, plot_format)
    if args.json:
        print(render.run_json(state, summary))
    else:
        log_dir = fsutil.display_path(fs, storage.log_dir())
        print(render.printed(render.run_text(storage.display_path, state, summary, log_dir)))
    return 0
