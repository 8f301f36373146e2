"""Installs where torch reaches Python from outside the interpreter's prefix
(tests/support/python_layouts.py: PYTHONPATH, ``pip install --target``, a ``.pth`` file
naming another environment, a ``--system-site-packages`` venv seeing the user's site).

Under each, a driver that imported torch forks the worker zygote from itself; the
zygote must keep torch (it is installed, not the user's code) and serve every start:
``fit()`` with one rank SIGKILLed, and ``launch`` of a script with the
``restart_in_process`` wrapper and one rank SIGKILLed, each see exactly one restart.
Before, the zygote dropped torch as "the user's code" and died, so the first attempt
failed too (two failures), or the job failed at its start with ``max_failures=0``.

CI runs each layout with 2 ``fit()`` runs (in one driver process, a zygote forked for
each) and 1 launch; ``-m long`` runs 5 of each.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess

import pytest

from tests.support import python_layouts
from tests.support.launched import run_state
from tests.support.paths import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420),
              pytest.mark.usefixtures("no_leaked_processes")]

DRIVER = os.path.join(REPO, "tests", "e2e", "scripts", "layout_driver.py")
SCRIPT = os.path.join(REPO, "tests", "e2e", "scripts", "launch_script.py")
CI_RUNS = 2  # fit() runs per driver process in CI (-m long: 5, and 5 launches)


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """The layouts, removed after the module: their hard links would otherwise keep a
    whole torch install (6.5 GB) alive in pytest's kept temp dirs once the venv they
    came from is gone (a CI clone), three runs of it at a time."""
    root = tmp_path_factory.mktemp("layouts")
    yield python_layouts.build(str(root))
    shutil.rmtree(root, ignore_errors=True)


def _layout(layouts, name):
    layout = layouts[name]
    if isinstance(layout, str):
        pytest.skip(layout)
    return layout


def _drive(layout, cwd, *args, timeout=300) -> tuple[dict, list[dict], str]:
    """Runs the layout driver; its LAYOUT line, its ZYGOTE lines, and its output."""
    proc = subprocess.Popen([layout.python, DRIVER, *map(str, args)], cwd=cwd,
                            env=layout.environ(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the driver; its workers die with it
            proc.wait()
    assert proc.returncode == 0, out
    lines = out.splitlines()
    [where] = [json.loads(line[len("LAYOUT "):]) for line in lines if line.startswith("LAYOUT ")]
    runs = [json.loads(line[len("ZYGOTE "):]) for line in lines if line.startswith("ZYGOTE ")]
    return where, runs, out


def _check_layout(name, where) -> None:
    """The layout is what it claims: torch outside the interpreter's prefixes (and, for a
    --target directory, not under a site-packages directory even once resolved)."""
    torch_file = os.path.realpath(where["torch"])
    for prefix in (where["prefix"], where["base_prefix"]):
        assert not torch_file.startswith(os.path.realpath(prefix) + os.sep), where
    if name == "target":
        assert "site-packages" not in torch_file.split(os.sep), where


def _fits(layouts, name, tmp_path, runs):
    layout = _layout(layouts, name)
    job = tmp_path / "job"  # the user's working directory
    job.mkdir(parents=True)
    where, fits, out = _drive(layout, job, "fit", tmp_path / "results", runs)
    _check_layout(name, where)
    assert [(r["forked"], r["failures"], r["zygote_errors"]) for r in fits] == \
        [(True, 1, [])] * runs, out


def _launches(layouts, name, tmp_path, runs):
    layout = _layout(layouts, name)
    job = tmp_path / "job"
    job.mkdir(parents=True)
    for i in range(runs):
        out_dir = tmp_path / f"launch{i}"
        out_dir.mkdir(parents=True)
        where, [launched], out = _drive(
            layout, job, "launch", "--nproc-per-node", 2, "--max-restarts", 3,
            "--storage-path", tmp_path / "results", "--name", f"launch{i}", SCRIPT, out_dir, 3,
            "--crash-at", 1, "--crash-how", "sigkill", "--restartable")
        _check_layout(name, where)
        failures = run_state(str(tmp_path / "results"), f"launch{i}")["failures"]
        assert (launched["forked"], len(failures)) == (True, 1), out
        assert failures[0]["workers"][0]["signal"] == "SIGKILL", failures


@pytest.mark.parametrize("name", python_layouts.NAMES)
def test_fit_one_sigkill_one_restart(layouts, name, tmp_path):
    _fits(layouts, name, tmp_path, runs=CI_RUNS)


@pytest.mark.parametrize("name", python_layouts.NAMES)
def test_launch_one_sigkill_one_restart(layouts, name, tmp_path):
    _launches(layouts, name, tmp_path, runs=1)


@pytest.mark.long
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("name", python_layouts.NAMES)
def test_five_times_each(layouts, name, tmp_path):
    _fits(layouts, name, tmp_path / "fit", runs=5)
    _launches(layouts, name, tmp_path / "launch", runs=5)
