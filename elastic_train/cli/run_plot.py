"""``elastic-train show RUN --plot FILE.png``: a picture of the run, from its directory.

In the format the file's suffix names (``.png``, ``.svg``, ``.pdf``, ...: matplotlib's
formats; another suffix is refused before the run is read, naming them).

Drawn with matplotlib (the ``plot`` extra: ``pip install 'elastic-train[plot]'``; a
clear ConfigError names it when it is missing), on its own figure and Agg canvas (no
global backend, no display). Time runs along x in seconds since the run was created:

- the reported metrics (up to :data:`MAX_METRICS` of the user's) and the median step
  time, per report (``metrics.jsonl``; when: :func:`report_times`), each reported
  checkpoint as a tick on top;
- the world size of each attempt, from the goodput ledger (rank 0's ``attempt``
  lines; a run without them: at each checkpoint still kept, its commit marker's);
- after each fault, bands for detection (the worker failed -> its agent knew),
  rendezvous (-> the group formed again), restore (-> the checkpoint was chosen and
  verified) and recompute (the work since that checkpoint, trained again), from
  ``run.json``'s failures and ``restores.json``, the same records ``show`` reads;
- the wall time by cause: from the goodput ledger when the run has one
  (:func:`~elastic_train.driver.metrics_feed.goodput_seconds`), else from the same
  failure records (detection, rendezvous, restore, recompute; the rest of the wall
  time not kept as training: other).

Example::

    elastic-train show ~/elastic_train_results/digits --plot digits.png
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from elastic_train._internal.metric_rows import numeric_items, user_metrics
from elastic_train.cli.run_summary import RunSummary, recoveries
from elastic_train.driver.metrics_feed import goodput_seconds
from elastic_train.errors import ConfigError
from elastic_train.storage import CommitManifest, RunStorage
from elastic_train.storage.run_state import RunState

MAX_METRICS = 2
PHASES = {"detection": "#d62728", "rendezvous": "#ff7f0e", "restore": "#9467bd",
          "recompute": "#8c564b"}


@dataclass(frozen=True)
class Band:
    """One phase of one fault's recovery, in seconds since the run was created."""

    phase: str
    start: float
    end: float


def fault_bands(state: RunState, storage: RunStorage, origin: float) -> list[Band]:
    """The phases after each fault (see the module), where the records have them."""
    bands = []
    restores = storage.read_restores()
    for failure, recovery in zip(state.failures, recoveries(state.failures, restores),
                                 strict=True):
        at = failure.failed_at - origin
        for phase, seconds in (("detection", recovery.detect_s),
                               ("rendezvous", recovery.rendezvous_s),
                               ("restore", recovery.restore_s),
                               ("recompute", recovery.recomputed_s)):
            if seconds:
                bands.append(Band(phase, at, at + seconds))
                at += seconds
    return bands


def report_times(rows: list[dict[str, Any]]) -> list[float | None]:
    """When each row's report was made, seconds since the epoch (None: not recorded).

    A row's ``timestamp`` is whole seconds; its ``time_since_restore`` is exact from its
    attempt's start. Every row of an attempt (its ``iterations_since_restore`` counts up)
    bounds that start from below by ``timestamp - time_since_restore``; the largest bound
    is within a second of the start, and closer the more rows the attempt has."""
    times: list[float | None] = []
    attempt: list[dict[str, Any]] = []

    def close() -> None:
        if attempt and all("time_since_restore" in r for r in attempt):
            start = max(r["timestamp"] - r["time_since_restore"] for r in attempt)
            times.extend(start + r["time_since_restore"] for r in attempt)
        else:
            times.extend(r.get("timestamp") for r in attempt)
        attempt.clear()

    for row in rows:
        if attempt and row.get("iterations_since_restore", 0) <= \
                attempt[-1].get("iterations_since_restore", 0):
            close()
        attempt.append(row)
    close()
    return times


def time_by_cause(storage: RunStorage, summary: RunSummary) -> tuple[dict[str, float], str]:
    """Seconds by cause and where they come from (see the module)."""
    ledger = goodput_seconds(storage)
    if ledger is not None:
        return ledger, "goodput ledger"
    lost = {"detection": sum(r.detect_s for r in summary.recoveries),
            "rendezvous": sum(r.rendezvous_s or 0.0 for r in summary.recoveries),
            "restore": sum(r.restore_s or 0.0 for r in summary.recoveries),
            "recompute": summary.redone_s}
    other = max(0.0, summary.wall_s - summary.train_s - sum(lost.values()))
    return {"productive": summary.train_s, **lost, "other": other}, "run.json's failures"


def _matplotlib() -> Any:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError("show --plot needs matplotlib: pip install 'elastic-train[plot]' "
                          "(or pip install matplotlib), or drop --plot.") from None
    return Figure, FigureCanvasAgg


def check_output(path: str) -> str:
    """The format ``path``'s suffix names (``svg`` for ``run.svg``), checked before the
    run is read: a ConfigError naming ``path`` and the fix when matplotlib draws no such
    format, ``path`` is a directory, or its directory does not exist. The output path is
    the user's own, so its errors never read as errors of the run."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        fix = (f"it is a directory: name a file in it, e.g. --plot "
               f"{os.path.join(path, 'run.png')}")
    elif not os.path.isdir(folder):
        fix = f"its directory {folder} does not exist: create it, or name a file elsewhere"
    else:
        formats = sorted(_matplotlib()[1].get_supported_filetypes())
        suffix = os.path.splitext(path)[1][1:].lower()
        if suffix in formats:
            return suffix
        fix = (f"its suffix names no format matplotlib draws: use one of "
               f"{', '.join('.' + f for f in formats)}, e.g. --plot run.png")
    raise ConfigError(f"show --plot {path!r} cannot be written: {fix}.")


def save(canvas: Any, path: str, file_format: str) -> None:
    """Writes the drawn run to ``path`` in ``file_format`` (:func:`check_output`'s); a
    failure to write is a ConfigError naming ``path``."""
    try:
        canvas.print_figure(path, format=file_format)
    except OSError as exc:
        raise ConfigError(f"show --plot {path!r} cannot be written ({type(exc).__name__}: "
                          f"{exc.strerror or exc}): name a file in a directory you may write."
                          ) from exc


def draw(storage: RunStorage, state: RunState, summary: RunSummary) -> Any:
    """The run drawn (see the module) on a canvas of its own, for :func:`save`."""
    figure_class, canvas_class = _matplotlib()
    origin = state.created or min((launch.started for launch in state.launches), default=0.0)
    rows = storage.read_metrics()
    names = sorted({k for row in rows for k in numeric_items(user_metrics(row))})[:MAX_METRICS]
    series = [*names, "step_time_s"]
    figure = figure_class(figsize=(10, 2.2 * (len(series) + 2)), layout="constrained")
    axes = figure.subplots(len(series) + 2, 1)
    time_axes = axes[:-1]
    for ax in time_axes[1:]:
        ax.sharex(time_axes[0])
    times = report_times(rows)
    for ax, key in zip(axes, series, strict=False):  # the series' axes come first
        points = [(t - origin, r[key]) for r, t in zip(rows, times, strict=True)
                  if isinstance(r.get(key), (int, float)) and t is not None]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", lw=1)
        ax.set_ylabel(key)
    for row, at in zip(rows, times, strict=True):  # every reported checkpoint, as a tick on top
        if row.get("checkpoint_dir_name") and at is not None:
            axes[0].axvline(at - origin, color="#2ca02c", lw=0.8, ls=":")
    sizes, source = world_sizes(storage.read_ledger(), summary.checkpoints, origin)
    world = axes[len(series)]
    world.step([c[0] for c in sizes], [c[1] for c in sizes], where="post", marker="o")
    world.set_ylabel(f"world size\n({source})")
    for band in fault_bands(state, storage, origin):
        for ax in time_axes:
            ax.axvspan(band.start, band.end, color=PHASES[band.phase], alpha=0.3, lw=0,
                       label=band.phase if ax is world else None)
    handles = dict(zip(*reversed(world.get_legend_handles_labels()), strict=True))
    if handles:
        world.legend(handles.values(), handles.keys(), loc="lower left", ncol=4, fontsize=8)
    time_axes[-1].set_xlabel("seconds since the run was created")
    _badput(axes[-1], *time_by_cause(storage, summary))
    figure.suptitle(f"{state.name or storage.display_path}: {state.status.value}, "
                    f"{len(state.failures)} fault(s), {len(summary.checkpoints)} checkpoint(s)")
    return canvas_class(figure)


def world_sizes(ledger: list[dict[str, Any]], checkpoints: list[CommitManifest], origin: float
                ) -> tuple[list[tuple[float, int]], str]:
    """(seconds since ``origin``, world size) at each attempt's start, from the goodput
    ``ledger``'s lines; a run whose ledger has none (older runs): at each kept
    checkpoint's commit. Also says which."""
    attempts = sorted((float(e["t"]) - origin, int(e["world_size"])) for e in ledger
                      if e.get("event") == "attempt" and e.get("world_size"))
    if attempts:
        return attempts, "attempts"
    return sorted((m.created - origin, m.world_size) for m in checkpoints), "kept checkpoints"


def _badput(ax: Any, seconds: dict[str, float], source: str) -> None:
    """The wall time by cause as one horizontal bar per cause."""
    causes = [c for c, s in seconds.items() if s > 0] or list(seconds)
    ax.barh(causes, [seconds[c] for c in causes],
            color=[PHASES.get(c, "#2ca02c" if c == "productive" else "#7f7f7f")
                   for c in causes])
    total = sum(seconds.values())
    for y, cause in enumerate(causes):
        share = seconds[cause] / total if total else 0.0
        ax.text(seconds[cause], y, f" {seconds[cause]:.1f} s ({share:.0%})", va="center",
                fontsize=8)
    ax.set_xlabel(f"seconds, by cause ({source})")
