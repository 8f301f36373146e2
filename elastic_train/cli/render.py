"""How ``elastic-train ls`` and ``show`` print a run: plain text for people, JSON for tools.

Everything shown comes from storage, which anyone who may write the storage path may
craft (a run.json, a directory's name, a metric): a string that holds terminal control
sequences would be obeyed, not shown -- a shown error overwritten (``\\r``), the window
title set or the clipboard written (OSC ``ESC ]``). So the text leaves through
:func:`printed` (each line escaped by :func:`terminal_safe`; the newlines between lines
are the renderer's own); JSON escapes every one itself (``ensure_ascii``).
"""

from __future__ import annotations

import datetime
import json
import shlex
from dataclasses import asdict

from elastic_train._internal.metric_rows import user_metrics
from elastic_train.cli.run_summary import Recovery, RunSummary
from elastic_train.errors import NO_PROGRESS_EXIT_CODE
from elastic_train.goodput.breakdown import Cause, Goodput
from elastic_train.goodput.interval import advise
from elastic_train.storage.run_state import FailureRecord, RunState

SHOWN_DELETED = 3  # more checkpoints deleted by retention than this are counted, not named
# C0 (newline, carriage return and tab included), DEL and C1: shown as Python writes them.
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))} | {
    ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"}


def terminal_safe(text: str) -> str:
    """``text`` with every control character escaped (``ESC`` as ``\\x1b``, ``CR`` as
    ``\\r``): what storage holds is shown to the terminal, never obeyed by it."""
    return text.translate(_CONTROLS)


def printed(lines: list[str]) -> str:
    """The text to print for ``lines``: one printed line each, escaped."""
    return "\n".join(terminal_safe(line) for line in lines)


def when(timestamp: float | None) -> str:
    if not timestamp:
        return "-"
    return datetime.datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S")


def age(timestamp: float | None, now: float) -> str:
    """``"42s"``, ``"5m"``, ``"3h"``, ``"2d"``: how long ago."""
    if not timestamp:
        return "-"
    seconds = max(0, int(now - timestamp))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def runs_table(runs: list[tuple[str, RunState, RunSummary]], now: float) -> list[str]:
    """``ls``: one line per run."""
    lines = [f"{'NAME':32} {'STATUS':11} {'ITER':>6} {'FAILURES':>8}  {'AGE':>5}  BEST"]
    for name, state, summary in runs:
        status = "damaged" if summary.damaged else state.status.value
        lines.append(f"{name:32} {status:11} {summary.iterations:>6} "
                     f"{len(state.failures):>8}  {age(state.updated, now):>5}  "
                     f"{summary.best_label()}")
    return lines


def runs_json(runs: list[tuple[str, RunState, RunSummary]]) -> str:
    return json.dumps([{"name": name, **state.to_json(), "iterations": summary.iterations,
                        "best_checkpoint": summary.best and summary.best.name,
                        **({"damaged": summary.damaged} if summary.damaged else {})}
                       for name, state, summary in runs], indent=2)


def run_json(state: RunState, summary: RunSummary) -> str:
    """``show --json``."""
    best = summary.best.index if summary.best else None
    return json.dumps({**state.to_json(), "iterations": summary.iterations,
                       "goodput": summary.goodput,
                       "recoveries": [asdict(r) for r in summary.recoveries],
                       "checkpoints": [{"index": c.index,
                                        "training_iteration": c.training_iteration,
                                        "metrics": c.metrics, "best": c.index == best,
                                        "ranks": c.ranks, "size_bytes": c.size_bytes,
                                        "validation": c.validation.get("status")}
                                       for c in summary.checkpoints],
                       "deleted_checkpoints": summary.deleted,
                       "step_times": summary.step_times,
                       "ledger": summary.ledger.to_json() if summary.ledger else None,
                       "checkpoint_interval": asdict(advice) if (
                           advice := summary.ledger and advise(summary.ledger)) else None},
                      indent=2)


def run_text(display_path: str, state: RunState, summary: RunSummary, log_dir: str) -> list[str]:
    """``show``: the run's spec, launches, failures with their recoveries, checkpoints."""
    spec = state.spec
    lines = [f"run:      {display_path}",
             f"status:   {state.status.value}   updated {when(state.updated)}   "
             f"iteration {summary.iterations}"]
    if state.no_progress:
        lines.append(f"stopped:  {state.no_progress} (exit code {NO_PROGRESS_EXIT_CODE})")
    if state.error:  # why a failed run stopped, as the user was told then
        first, *rest = state.error.rstrip("\n").split("\n")  # a "\r" in it is escaped
        lines += [f"error:    {first}", *(f"          {line}" for line in rest)]
    if spec.get("command"):
        lines.append(f"command:  {shlex.join(spec['command'])}")
    if spec.get("train_function"):
        workers = spec.get("scaling_config", {}).get("num_workers")
        lines.append(f"train:    {spec['train_function']} on {workers} worker(s)")
    for key in ("failure_config", "checkpoint_config"):
        if spec.get(key):
            lines.append(f"{key.split('_')[0] + ':':9} {spec[key]}")
    lines.append(f"launches: {len(state.launches)}")
    lines += [f"  {when(launch.started)}  {launch.host}  pid {launch.pid}  "
              f"{launch.status.value}" for launch in state.launches]
    lines.append(f"failures: {len(state.failures)}")
    for failure, recovery in zip(state.failures, summary.recoveries, strict=True):
        lines += [*failure_lines(failure), f"      {recovery_line(recovery)}"]
    if summary.ledger is not None:
        lines += ledger_lines(summary.ledger)
    elif summary.goodput is not None:
        lines.append(f"goodput:  {summary.goodput:.1%}  ({summary.train_s:.1f} s of training "
                     f"kept, {summary.wall_s:.1f} s wall clock over all launches, "
                     f"{summary.redone_s:.1f} s redone after failures)")
    return (lines + step_lines(state, summary) + checkpoint_lines(summary)
            + [f"logs:     {log_dir}"])


def ledger_lines(ledger: Goodput) -> list[str]:
    """The goodput ledger: ETTR, each cause's seconds and share, per attempt, and the
    checkpoint interval used beside Young/Daly's optimum."""
    lines = [f"goodput:  {ledger.describe()}"]
    lines += [f"  {cause.value:11} {ledger.seconds[cause]:9.1f} s  {ledger.share(cause):6.1%}"
              for cause in Cause]
    if len(ledger.attempts) > 1:
        lines += [f"  attempt {n}: " + ", ".join(f"{c.value} {s:.1f} s"
                                                 for c, s in attempt.seconds.items() if s)
                  for n, attempt in enumerate(ledger.attempts, 1)]
    advice = advise(ledger)
    if advice is not None:
        lines.append(f"interval: {advice.describe()}")
    return lines


def step_lines(state: RunState, summary: RunSummary) -> list[str]:
    """The latest report's step times, the nodes named stragglers (see
    :mod:`elastic_train.stragglers`) and those that left the job."""
    lines = []
    steps = summary.step_times
    if steps:
        lines.append(f"steps:    {steps['step_time_s']:.3g} s median at the latest report; "
                     f"slowest rank {steps['slowest_rank']} on node {steps['slowest_node']}: "
                     f"{steps['slowest_rank_score']:.2f}x")
    lines.append(f"stragglers: {len(state.stragglers)}")
    lines += [f"  {when(s.since)}  {s.describe()}" for s in state.stragglers]
    if state.departures:  # see elastic_train._internal.departures
        lines.append(f"left:     {len(state.departures)} node(s)")
        lines += [f"  {when(d.left_at)}  {d.describe()}" for d in state.departures]
    return lines


def failure_lines(failure: FailureRecord) -> list[str]:
    """A failure, and the restart it had."""
    root = failure.root
    how = ("hung" if root.hung else f"signal {root.signal_name}" if root.signal_name
           else f"exit code {root.exitcode}")
    said = "without a Python exception" if root.without_exception else root.message[:100]
    lines = [f"  {when(failure.time)}  [{failure.kind.value}] rank {root.rank} {how}: {said}"]
    if failure.restart:
        replaced = "".join(f"; rank {rank} in a new process ({why})"
                           for rank, why in sorted(failure.replaced.items()))
        lines.append(f"      restart:  {failure.restart}{replaced}")
    return lines


def recovery_line(recovery: Recovery) -> str:
    def sec(value: float | None) -> str:
        return "?" if value is None else f"{value:.1f} s"

    redone = ("?" if recovery.recomputed_iterations is None else
              f"{recovery.recomputed_iterations} iteration(s), {sec(recovery.recomputed_s)}")
    return (f"recovery: detected in {sec(recovery.detect_s)}, rendezvous "
            f"{sec(recovery.rendezvous_s)}, ready {sec(recovery.restore_s)}; redone {redone}")


def checkpoint_lines(summary: RunSummary) -> list[str]:
    best = summary.best.index if summary.best else None
    lines = [f"checkpoints: {len(summary.checkpoints)} retained, {len(summary.deleted)} "
             "deleted by retention"]
    for c in summary.checkpoints:
        shown = user_metrics(c.metrics)
        mark = "*" if c.index == best else " "
        validation = f"  {c.validation['status']}" if c.validation else ""
        lines.append(f"{mark} {c.name}  iteration {c.training_iteration}  "
                     f"{c.describe_contents()}  {shown}{validation}")
    if best is not None:
        lines.append(f"  (* best: {summary.best_label()})")
    deleted = summary.deleted
    if len(deleted) > SHOWN_DELETED:  # a long run deletes hundreds: their range
        lines.append(f"  deleted: {len(deleted)}, {deleted[0]} to {deleted[-1]} "
                     "(`show --json` lists them)")
    elif deleted:
        lines.append(f"  deleted: {', '.join(deleted)}")
    return lines

