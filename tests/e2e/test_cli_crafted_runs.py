"""``elastic-train ls`` and ``show`` as real processes on storage paths that someone who may
write them crafted: a FIFO where a run's file should be (``ls`` lists that run as damaged
and shows the others, at once; ``show`` names the file) and strings holding terminal
control sequences (printed escaped, on stdout and stderr alike)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.crafted_runs import RAW, crafted_run, fifo_run
from tests.support.paths import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60),
              pytest.mark.usefixtures("no_leaked_processes")]

QUICK_S = 15  # the interpreter and the CLI's imports on a busy machine; a FIFO read: for ever


def cli(*args: str) -> subprocess.CompletedProcess:
    """``python -m elastic_train.cli ARGS``, killed after :data:`QUICK_S` (its output as
    bytes: what a terminal would get)."""
    return subprocess.run([sys.executable, "-m", "elastic_train.cli", *args], cwd=REPO,
                          capture_output=True, timeout=QUICK_S)


@pytest.mark.parametrize("entry", ["metrics.jsonl", "restores.json", "goodput/rank0.jsonl",
                                   "checkpoint_000000/.commit.json"])
def test_a_fifo_in_one_run_hides_no_other_run(tmp_path, entry):
    root = tmp_path / "results"
    (root / "good").mkdir(parents=True)
    (root / "good" / "run.json").write_text(json.dumps({"status": "finished",
                                                       "format_version": 1, "created": 1.0}))
    fifo_run(root, "odd", entry)
    listed = cli("ls", str(root))
    out, err = listed.stdout.decode(), listed.stderr.decode()
    assert listed.returncode == 0, err
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()[1:]}
    assert rows == {"good": "finished", "odd": "damaged"}, out
    assert err.count("\n") == 1 and f"{entry} is not a regular file but a FIFO" in err, err
    (damaged,) = [r["damaged"] for r in json.loads(cli("ls", "--json", str(root)).stdout)
                  if r.get("damaged")]
    assert "FIFO" in damaged
    shown = cli("show", str(root / "odd"))
    assert shown.returncode == 2 and f"{entry} is not a regular file" in shown.stderr.decode()


def test_control_sequences_are_printed_escaped(tmp_path):
    root = tmp_path / "results"
    name = crafted_run(root)
    (root / f"cut{RAW[0]}").mkdir()  # a run.json cut short: ls warns, naming the directory
    (root / f"cut{RAW[0]}" / "run.json").write_text('{"status": "fini')
    for args in (["ls", str(root)], ["show", str(root / name)],
                 ["show", str(root / f"cut{RAW[0]}")]):
        done = cli(*args)
        printed = (done.stdout + done.stderr).decode()
        for raw in RAW:
            assert raw not in printed, (args, raw, printed)
        assert "\\x1b]0;owned\\x07" in printed, printed
