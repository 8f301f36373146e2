"""The torch versions elastic-train supports, and what differs between them
(elastic_train/agent/torch_compat.py; docs/TORCH_INTERNALS.md has the table). These run
on every torch CI checks (.ci/compat), so the table is checked against each one."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
import torch

from elastic_train.agent import torch_compat
from elastic_train.agent.torch_compat import UnsupportedTorchError, check_version
from elastic_train.errors import ConfigError
from tests.support.paths import REPO

pytestmark = pytest.mark.compat

MINOR = tuple(int(part) for part in torch.__version__.split(".")[:2])


@pytest.mark.parametrize("version", ["2.9.0", "2.9.1", "2.11.0+cu128", "2.13.0+cpu",
                                     "2.14.1", "2.12.0a0+git1234"])
def test_versions_in_range_pass(version):
    check_version(version)


@pytest.mark.parametrize("version", ["2.8.0", "2.4.1+cpu", "2.15.0", "3.0.0", "1.13.1", "x"])
def test_versions_outside_the_range_are_refused_in_one_line(version):
    with pytest.raises(UnsupportedTorchError) as raised:
        check_version(version)
    message = str(raised.value)
    assert "\n" not in message and "torch 2.9 to 2.14" in message and version in message
    assert isinstance(raised.value, ConfigError)  # the CLI prints it as one line, exit 2


def test_what_differs_matches_the_installed_torch():
    """The table of docs/TORCH_INTERNALS.md, for the torch these tests run on."""
    assert torch_compat.AGENT_SHUTDOWN_TIMEOUT == (MINOR >= (2, 12))
    assert torch_compat.SHUTDOWN_TAKES_TIMEOUT == (MINOR >= (2, 12))
    assert torch_compat.VIRTUAL_LOCAL_RANK == (MINOR >= (2, 10))
    dests = {action.dest: action for action in torch_compat.torchrun_parser()._actions}
    assert dests["master_port"].default is None  # 29500 in torch's own before 2.12
    assert ("shutdown_timeout" in dests) == (MINOR >= (2, 12))
    assert ("signals_to_handle" in dests) == (MINOR >= (2, 10))
    assert ("virtual_local_rank" in dests) == (MINOR >= (2, 10))


def test_agent_options_only_what_torch_takes():
    assert torch_compat.agent_options(7) == (
        {"shutdown_timeout": 7} if MINOR >= (2, 12) else {})
    assert torch_compat.worker_spec_options(None, False) == {}
    if torch_compat.VIRTUAL_LOCAL_RANK:
        assert torch_compat.worker_spec_options(None, True) == {"virtual_local_rank": True}
    else:
        with pytest.raises(ConfigError, match="virtual_local_rank needs torch 2.10"):
            torch_compat.worker_spec_options(None, True)


class _Context:
    def __init__(self):
        self.closed = []

    def close(self, death_sig=None, timeout=30):
        self.closed.append((death_sig, timeout))


@pytest.mark.parametrize("takes_timeout", [True, False])
def test_shutdown_waits_the_agents_timeout_on_every_version(monkeypatch, takes_timeout):
    """torch before 2.12 closes the workers with a fixed 30 s: ours is passed to the
    process context's close instead, and the close is put back afterwards."""
    monkeypatch.setattr(torch_compat, "SHUTDOWN_TAKES_TIMEOUT", takes_timeout)
    context = _Context()
    calls = []

    def torch_shutdown(death_sig, timeout=None):  # torch's: closes with its default
        calls.append((death_sig, timeout))
        if timeout is None:
            context.close(death_sig)
        else:
            context.close(death_sig, timeout)

    torch_compat.shutdown(torch_shutdown, context, signal.SIGTERM, 7)
    assert context.closed == [(signal.SIGTERM, 7)]
    assert calls == [(signal.SIGTERM, 7 if takes_timeout else None)]
    context.close(signal.SIGKILL)
    assert context.closed[-1] == (signal.SIGKILL, 30)  # its own close again


_AS_TORCH_2_8 = "import torch; torch.__version__ = '2.8.0'; "


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _AS_TORCH_2_8 + code], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(150)
def test_an_old_torch_is_refused_when_the_trainer_is_imported():
    proc = _run("from elastic_train.torch import TorchTrainer")
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last == ("elastic_train.agent.torch_compat.UnsupportedTorchError: torch 2.8.0 is "
                    "not supported: elastic-train supports torch 2.9 to 2.14; install one in "
                    "that range (pip install 'torch>=2.9,<2.15').")


@pytest.mark.timeout(150)
def test_an_old_torch_is_refused_by_launch_in_one_line(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('never')\n")
    proc = _run(f"from elastic_train.cli import main; raise SystemExit(main(['launch', "
                f"'--dry-run', {str(script)!r}]))")
    assert proc.returncode == 2 and not proc.stdout
    assert proc.stderr.startswith("elastic-train: torch 2.8.0 is not supported: elastic-train "
                                  "supports torch 2.9 to 2.14; install one in that range")
    assert proc.stderr.count("\n") == 1
