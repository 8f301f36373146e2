"""The examples as modules (``examples/`` is not a package), pickled by value so that
workers need not import them, plus the faults the e2e tests inject into them."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from types import ModuleType

import cloudpickle

import elastic_train
from tests.support.paths import REPO

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "examples")


def load_example(name: str) -> ModuleType:
    """``examples/<name>.py`` imported as a module named ``name``."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        cloudpickle.register_pickle_by_value(module)
    return sys.modules[name]


def first_attempt(marker: str) -> bool:
    """True once per test: the first caller creates ``marker``."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False


def wait_for_kill(pid_file: str, timeout_s: float = 120.0) -> None:
    """Writes this process's pid for the test to SIGKILL it, and waits to be killed."""
    with open(pid_file + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(pid_file + ".tmp", pid_file)
    time.sleep(timeout_s)
    raise TimeoutError(f"nobody killed pid {os.getpid()} within {timeout_s} s")


def kill_self_once_committed(marker: str, checkpoint_dir: str, timeout_s: float = 60.0) -> None:
    """SIGKILLs this process, the first time only, once ``checkpoint_dir`` of the run is
    committed (so that the restart has it to resume from)."""
    if not first_attempt(marker):
        return
    run = elastic_train.get_context().get_storage().experiment_fs_path
    commit = os.path.join(run, checkpoint_dir, ".commit.json")
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(commit) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)


FSDP_QUICK = ["--steps", "20", "--checkpoint-every", "10", "--kill-at-step", "15",
              "--more-steps", "10"]


def run_fsdp_example(tmp_path, *args) -> str:
    """``examples/fsdp_transformer.py args...`` storing under ``tmp_path``; its output (it
    must succeed)."""
    proc = subprocess.run([sys.executable, "examples/fsdp_transformer.py", "--storage-path",
                           str(tmp_path), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=360)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout
