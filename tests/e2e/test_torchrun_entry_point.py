"""The ``torchrun.handlers`` entry point (pyproject.toml) loads cleanly from any import order.

torch loads out-of-tree rendezvous handlers while its own rendezvous package is
being imported, which can be in the middle of importing torch's agent (e.g. from
``torch.distributed.checkpoint``); an entry point that imports back into a half
initialised torch module makes torch log a traceback per process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from tests.support.paths import REPO

WARNING = "Exception while registering out of tree plugin"

pytestmark = pytest.mark.skipif(
    not any(e.name == "etcd-v3" for e in entry_points(group="torchrun.handlers")),
    reason="elastic-train is not installed (pip install -e .): no torchrun.handlers entry point")

FIRST_IMPORTS = [
    "torch.distributed.checkpoint",
    "torch.distributed.elastic.agent.server.api",
    "torch.distributed.elastic.rendezvous",
    "torch.distributed.run",
    "elastic_train.agent.rendezvous",
    "elastic_train.agent",
    "elastic_train.driver.launch_settings",
]


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": REPO}
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, text=True,
                          capture_output=True, timeout=60)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("first", FIRST_IMPORTS)
def test_entry_point_loads_cleanly_whatever_is_imported_first(first: str) -> None:
    proc = _python(
        f"import {first}\n"
        "from torch.distributed.elastic.rendezvous.registry import handler_registry\n"
        "print('REGISTERED', 'etcd-v3' in handler_registry._registry)\n")
    assert proc.returncode == 0, proc.stderr
    assert WARNING not in proc.stderr, proc.stderr
    assert "REGISTERED True" in proc.stdout


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_plain_torchrun_worker_importing_dcp_logs_no_traceback(tmp_path) -> None:
    """Every FSDP/DCP job imports torch.distributed.checkpoint in each worker."""
    script = tmp_path / "dcp_worker.py"
    script.write_text("import torch.distributed.checkpoint\nprint('IMPORTED', flush=True)\n")
    env = {**os.environ, "PYTHONPATH": REPO}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(script)], cwd=REPO, env=env, text=True, capture_output=True, timeout=100)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert output.count("IMPORTED") == 2
    assert WARNING not in output, output
