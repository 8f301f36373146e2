"""The modules we start with ``python -m`` are not imported by their own packages: runpy
would warn at every start (``<frozen runpy>: RuntimeWarning: '...' found in sys.modules
after import of package ...``), in every worker's output."""

from __future__ import annotations

import subprocess
import sys

import pytest

from elastic_train.agent.zygote.server import WORKER_MODULES

ENTRY_POINTS = ("elastic_train.agent.zygote.server", "elastic_train.cli.__main__", *WORKER_MODULES)
PROBE = ("import importlib, sys\n"
         "module = sys.argv[1]\n"
         "importlib.import_module(module.rpartition('.')[0])\n"
         "assert module not in sys.modules, module\n")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_python_m_entry_points_start_without_runpys_warning(module):
    subprocess.run([sys.executable, "-c", PROBE, module], check=True, timeout=100)
