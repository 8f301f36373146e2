"""The chaos suite's table, printed at the end of the pytest run."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

import pytest

from tests.chaos.faults import KINDS, LAUNCH_SCRIPT, REPO, launch_digest
from tests.chaos.ledger_check import adds_up
from tests.conftest import EPOCHS

RESULTS: list[dict] = []  # one row per trial, filled by test_chaos.py
SEED = int(os.environ.get("CHAOS_SEED", str(int(time.time()) % 100_000)))  # of the draw


@pytest.fixture(scope="session")
def launch_baseline(tmp_path_factory) -> str:
    """The launch script's digest, uninterrupted on one node."""
    out = tmp_path_factory.mktemp("launch-baseline")
    proc = subprocess.run(
        [sys.executable, "-m", "elastic_train.cli", "launch", "--standalone",
         "--storage-path", str(out / "results"), LAUNCH_SCRIPT, str(out), str(EPOCHS + 3)],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return launch_digest(proc.stdout)


def save(row: dict) -> None:
    """Appends a finished trial's row to ``$CHAOS_RESULTS`` (JSON lines), if set, so a
    long run's rows outlive an interrupted pytest: ``python -m tests.chaos.conftest FILE``
    prints their table."""
    path = os.environ.get("CHAOS_RESULTS")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps(row) + "\n")


def table(results: list[dict] = RESULTS) -> str:
    """Faults by kind: injected, passed (every check held), recovered, data lost, leaked
    processes, recovery times, ledgers that added up (of the trials with one); then the
    replay command of each failed trial and each ledger that did not add up."""
    lines = ["chaos suite: faults by kind",
             f"{'kind':24} {'injected':>8} {'passed':>6} {'recovered':>9} {'data lost':>9} "
             f"{'leaked':>6} {'recovery median s':>17} {'max s':>6} {'ledger adds up':>14}"]
    for kind in (*KINDS, "all"):
        rows = [r for r in results if kind in ("all", r["kind"])]
        if not rows:
            continue
        times = [r["recovery_s"] for r in rows if r["recovery_s"] is not None]
        median = f"{statistics.median(times):.2f}" if times else "-"
        worst = f"{max(times):.2f}" if times else "-"
        passed = sum(_passed(r) for r in rows)
        ledgers = [adds_up(r) for r in rows if adds_up(r) is not None]
        lines.append(f"{kind:24} {len(rows):>8} {passed:>6} "
                     f"{sum(r['recovered'] for r in rows):>9} "
                     f"{sum(r['data_lost'] for r in rows):>9} {sum(r['leaked'] for r in rows):>6} "
                     f"{median:>17} {worst:>6} {f'{sum(ledgers)}/{len(ledgers)}':>14}")
    failed = [r for r in results if not _passed(r)]
    if failed:
        lines.append(f"failed trials ({len(failed)}), each replayed alone by its command:")
        lines += [f"  {r['trial']}\n    {r.get('replay', '')}" for r in failed]
    unbalanced = [r for r in results if r.get("ledger_problems")]
    if unbalanced:
        lines.append(f"ledgers that did not add up ({len(unbalanced)}):")
        lines += [f"  {r['trial']}: {r['ledger_problems']}" for r in unbalanced]
    return "\n".join(lines)


def _passed(row: dict) -> bool:
    """Every check of the trial held (rows saved before "passed" existed: no loss, no leak,
    recovered)."""
    if "passed" in row:
        return row["passed"]
    return bool(row["recovered"]) and not row["data_lost"] and not row["leaked"]


def pytest_terminal_summary(terminalreporter) -> None:
    if RESULTS:
        terminalreporter.write_sep("=", f"chaos (seed {SEED})")
        terminalreporter.write_line(table())


if __name__ == "__main__":
    with open(sys.argv[1]) as rows:
        print(table([json.loads(line) for line in rows if line.strip()]))
