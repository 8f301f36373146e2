"""The zygote's import probe: safe modules, tainting ones, and its time budget (the
zygote forks no worker while it probes)."""

import sys
import time

import pytest

from elastic_train.agent.zygote_preload import probe

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
