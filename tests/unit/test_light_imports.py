"""The command line's ``ls``/``show`` and the public config types load without torch
(``import torch`` costs seconds; ``elastic-train ls`` should answer at once)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = ("import sys\n"
         "import elastic_train.cli.main, elastic_train.cli.commands, elastic_train.config\n"
         "from elastic_train import RendezvousConfig, RunConfig, ScalingConfig\n"
         "loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
         "assert not loaded, loaded[:5]\n")


@pytest.mark.timeout(60)
def test_cli_and_configs_do_not_import_torch():
    subprocess.run([sys.executable, "-c", PROBE], check=True, timeout=50)
