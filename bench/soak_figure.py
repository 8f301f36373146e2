"""Figure 14: the soak -- one run, N faults, nothing lost and nothing left behind.

Runs :mod:`tests.support.soak` in a process of its own: a 2-rank ``fit()`` whose
train function reads a DataLoader with 2 worker processes; rank 1 fails in each
of the first N attempts (an exception, a SIGKILL, an exit, in turn) after the
attempt committed a checkpoint; rank 0 survives all of them. The run is checked
against a fault-free run of the same job.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from typing import TYPE_CHECKING

from bench import procs
from bench.report import Table
from bench.stats import Target
from bench.variants import REPO, base_env

if TYPE_CHECKING:
    from bench.suite import Suite

RSS_GROWTH = Target(0.05, at_least=False)


def _cell(value: object, good: bool) -> str:
    return f"{value} {'PASS' if good else 'MISS'}"


def soak(suite: Suite) -> list[Table]:
    faults = suite.profile.soak_faults
    work = tempfile.mkdtemp(prefix="bench-soak-")
    try:
        out = os.path.join(work, "result.json")
        result = procs.run([sys.executable, "-m", "tests.support.soak", str(faults),
                            os.path.join(work, "storage"), out], base_env(1), cwd=REPO,
                           timeout_s=60 + 15 * faults, log_path=os.path.join(work, "log"))
        suite.echo(f"  [soak] {faults} faults: {'ok' if result.ok else 'FAILED'} in "
                   f"{result.ended - result.launched:.0f} s")
        data = json.load(open(out)) if os.path.exists(out) else None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    table = Table(f"Figure 14 — soak: {faults} faults in one fit() run",
                  ["check", "result", "target"])
    if data is None:
        suite.fatal_failures += 1
        table.add("the soak run", f"failed: ...{result.output_tail[-300:]}", "")
        return [table]
    second, last = data["second"], data["last"]
    growth = data["rss_growth"]
    table.add("run finished", _cell(data["finished"], data["finished"]), "yes")
    table.add("faults recorded / restarts in process / ranks given a new process",
              f"{data['failures_recorded']} / {data['in_process']} / {data['replaced']}",
              f"{faults} / {faults} / -")
    table.add("checkpoints lost", _cell(data["lost_checkpoints"], data["lost_checkpoints"] == 0),
              "0")
    table.add("final weights bit-identical to a fault-free run",
              _cell(data["identical"], data["identical"]), "yes")
    for what in ("fds", "threads", "children"):
        before, after = second.get(what), last.get(what)
        table.add(f"survivor's {what}: start of attempt 2 → start of the last",
                  _cell(f"{before} → {after}", before == after), "equal")
    table.add("survivor's RSS growth, attempt 2 → last",
              f"{second.get('rss_kb', 0) / 1024:.0f} → {last.get('rss_kb', 0) / 1024:.0f} MiB, "
              f"{growth:+.1%} {RSS_GROWTH.verdict(growth)}" if growth is not None else "n/a",
              "≤ +5 %")
    median, worst = data["recovery_median_s"], data["recovery_max_s"]
    table.add("recovery (failure → group ready), median / max",
              f"{median:.2f} / {worst:.2f} s" if median is not None else "n/a", "")
    table.notes.append("tests/support/soak.py: 2 ranks, Adam, DataLoader(num_workers=2) through "
                       "prepare_data_loader, a SYNC checkpoint every 4 batches and the fault at "
                       "the 5th, so every restart makes progress; rank 0 (the survivor) probes "
                       "/proc/self at the start of every attempt. Lost = a reported "
                       "checkpoint that is not committed, or whose files no longer match "
                       "their manifest.")
    return [table]
