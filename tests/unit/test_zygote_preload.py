"""The zygote's import probe: safe modules, tainting ones, and its time budget (the
zygote forks no worker while it probes)."""

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from elastic_train.agent.zygote.preload import POISONS, probe
from tests.support.paths import REPO

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork")


@pytest.fixture
def modules(tmp_path, monkeypatch):
    def write(name: str, body: str) -> str:
        (tmp_path / f"{name}.py").write_text(body)
        return name
    monkeypatch.syspath_prepend(str(tmp_path))
    return write


def test_safe_tainting_and_failing_modules(modules):
    names = [modules("probe_plain", "X = 1\n"),
             modules("probe_thread", "import threading, time\n"
                     "threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n"),
             modules("probe_after", "Y = 2\n"),
             modules("probe_broken", "raise ImportError('no')\n")]
    safe, skipped, unprobed = probe(names, budget_s=30)
    assert safe == ["probe_plain", "probe_after"]
    assert skipped == {"probe_thread": "its import started a thread",
                       "probe_broken": "its import failed (ImportError)"}
    assert unprobed == []


def test_the_probe_stops_at_its_time_budget(modules):
    names = [modules("budget_fast", "X = 1\n"),
             modules("budget_slow", "import time\ntime.sleep(30)\n"),
             modules("budget_never", "Y = 2\n")]
    began = time.monotonic()
    safe, skipped, unprobed = probe(names, budget_s=1.5)
    assert time.monotonic() - began < 5
    assert safe == ["budget_fast"]
    assert unprobed == ["budget_slow", "budget_never"]  # cut short, then never tried
    assert skipped == {}


def test_a_first_module_over_the_budget_is_skipped(modules):
    names = [modules("budget_slow_first", "import time\ntime.sleep(30)\n")]
    safe, skipped, unprobed = probe(names, budget_s=1.0)
    assert (safe, skipped, unprobed) == (
        [], {"budget_slow_first": "its import took too long"}, [])


@pytest.mark.skipif(not hasattr(torch._C, "_cuda_isInBadFork"),
                    reason="torch's CPU-only build has no fork poison")
def test_a_module_that_poisons_forks_is_found_and_skipped(tmp_path):
    """``torch.cuda.is_available()`` at import poisons every later fork of the zygote,
    yet changes nothing the importing process can see; the probe finds the module among
    others (the check comes at the end of the batch, so it bisects). In a fresh
    interpreter: this test process may be poisoned already."""
    for name, body in [("poison_plain1", "X = 1\n"), ("poison_plain2", "X = 2\n"),
                       ("poison_asks", "import torch\ntorch.cuda.is_available()\n"),
                       ("poison_plain3", "X = 3\n")]:
        (tmp_path / f"{name}.py").write_text(body)
    code = ("import json, sys; from elastic_train.agent.zygote.preload import probe; "
            "print(json.dumps(probe(['poison_plain1', 'poison_plain2', 'poison_asks', "
            "'poison_plain3'], budget_s=30)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              [str(tmp_path), REPO, os.environ.get("PYTHONPATH", "")])})
    safe, skipped, unprobed = json.loads(proc.stdout.splitlines()[-1])
    assert safe == ["poison_plain1", "poison_plain2", "poison_plain3"]
    assert skipped == {"poison_asks": POISONS}
    assert unprobed == []
