"""A node's health checks (#26 item 4): each runs for real (forked children, commands,
a real file system) and names what it found; the built-in HealthPolicy that runs them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from elastic_train._internal.failure_kinds import FailureKind
from elastic_train.agent.health_checks import (
    CallableCheck,
    CommandCheck,
    DeviceCheck,
    FreeSpaceCheck,
    StorageCheck,
    run_checks,
)
from elastic_train.agent.health_policy import HealthPolicy
from elastic_train.agent.node_policy import (
    ADMITTED,
    STAY,
    Candidate,
    ChargedFailures,
    leave,
)
from elastic_train.agent.worker_slots import surviving
from elastic_train.storage import RunStorage

pytestmark = pytest.mark.timeout(120)


def test_the_cpu_computes_and_a_node_without_cuda_passes_the_cuda_check():
    cpu, cuda = run_checks([DeviceCheck("cpu"), DeviceCheck("cuda")])
    assert cpu.ok and cpu.detail == "1 device(s) computed correctly", cpu
    if not cuda.ok or cuda.detail != "no cuda devices":
        pytest.skip(f"this machine has CUDA devices: {cuda}")


def test_the_device_check_leaves_the_agent_fit_to_fork_workers_from():
    """The probe asks torch.cuda for its devices in a forked child: the process that runs
    it is not poisoned, so workers forked from it later can use CUDA (the CUDA build shows
    the poison on CPU machines too)."""
    script = textwrap.dedent("""
        import os, torch
        from elastic_train.agent.health_checks import DeviceCheck
        print(DeviceCheck("cuda").check())
        pid = os.fork()
        if pid == 0:
            os._exit(3 if torch.cuda._is_in_bad_fork() else 0)
        print("poisoned" if os.waitpid(pid, 0)[1] else "clean")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=90, check=True).stdout.split("\n")
    assert out[1] == "clean", out


def test_the_cpu_check_computes_in_a_child_of_a_process_that_trained():
    """OpenMP's thread pool does not survive a fork: the child of a process whose pool ran
    hung in its first parallel matmul (the check computes on one thread now)."""
    script = textwrap.dedent("""
        import torch
        from elastic_train.agent.health_checks import DeviceCheck
        a = torch.randn(512, 512)
        for _ in range(20):
            a @ a  # the pool's threads run
        print(DeviceCheck("cpu", timeout_s=20).check())
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=90, check=False)
    assert done.stdout.strip() == "1 device(s) computed correctly", done.stderr[-2000:]


def test_free_space_below_the_need_names_the_path_and_the_figures(tmp_path):
    ok, short = run_checks([FreeSpaceCheck((str(tmp_path),), min_free_bytes=1),
                            FreeSpaceCheck((str(tmp_path),), min_free_bytes=2**62)])
    assert ok.ok and str(tmp_path) in ok.detail and "GiB free" in ok.detail
    assert not short.ok and short.name == "free space"
    assert f"{tmp_path} has" in short.detail and "GiB needed" in short.detail


def test_storage_round_trip_passes_on_a_writable_run_and_fails_on_a_broken_one(tmp_path):
    run = tmp_path / "run"
    storage = RunStorage.open(str(tmp_path), "run")
    storage.ensure_writable()
    assert run_checks([StorageCheck(storage)])[0].ok
    assert os.listdir(run) == []  # the probe is gone
    run.rmdir()
    run.write_text("a file where the run directory was")  # root writes anywhere else
    failed = run_checks([StorageCheck(storage)])[0]
    assert not failed.ok and failed.name == "storage" and "Not a directory" in failed.detail, \
        failed


def test_a_command_fails_with_its_exit_code_and_last_words():
    ok, bad, missing, slow = run_checks([
        CommandCheck(("true",)),
        CommandCheck(("sh", "-c", "echo checking; echo 'ECC errors: 12' >&2; exit 3")),
        CommandCheck(("/nonexistent/check",)),
        CommandCheck(("sleep", "5"), timeout_s=0.3)])
    assert ok.ok and ok.detail == "exit code 0"
    assert not bad.ok and bad.detail == "exit code 3: ECC errors: 12"
    assert bad.name == "command sh -c echo checking; echo 'ECC errors: 12' >&2; exit 3"
    assert not missing.ok and "could not start" in missing.detail
    assert not slow.ok and slow.detail == "it did not end within 0.3s" and slow.seconds < 2


def test_a_command_is_judged_by_its_exit_code_and_what_it_left_running_is_ended(tmp_path):
    """A command that exits 0 at once but leaves a background child holding its output
    (a daemon it starts, ``cmd &``) is healthy as soon as it exits; the child is ended
    with the command's process group, not left running."""
    pid_file = tmp_path / "child.pid"
    result = run_checks([CommandCheck(
        ("sh", "-c", f"sleep 60 & echo $! > {pid_file}; echo started"), timeout_s=20)])[0]
    assert result.ok and result.detail == "exit code 0", result
    assert result.seconds < 5, result  # not the 20 s of timeout_s
    child = int(pid_file.read_text())
    assert surviving([child], wait_s=5) == {}, f"the background child {child} was left running"


def test_a_commands_output_is_read_up_to_a_bound():
    """Only the end of what a command wrote is read, whatever it wrote."""
    result = run_checks([CommandCheck(
        (sys.executable, "-c", "import sys; sys.stdout.write('x' * 10**7 + '\\nthe end\\n'); "
         "sys.exit(2)"))])[0]
    assert not result.ok and result.detail.startswith("exit code 2: x")
    assert result.detail.endswith("x / the end") and len(result.detail) < 3000


def _raises():
    raise RuntimeError("GPU 3 fell off the bus")


def test_a_callable_runs_in_a_child_and_fails_by_raising_returning_false_or_hanging():
    parent = os.getpid()
    ok, said, raised, false, hung, died = run_checks([
        CallableCheck(lambda: None),
        CallableCheck(lambda: f"checked in {'a child' if os.getpid() != parent else 'here'}"),
        CallableCheck(_raises),
        CallableCheck(lambda: False),
        CallableCheck(lambda: time.sleep(5), timeout_s=0.3),
        CallableCheck(lambda: os._exit(7))])
    assert ok.ok and ok.detail == "passed"
    assert said.ok and said.detail == "checked in a child"
    assert not raised.ok and raised.name == "_raises"
    assert raised.detail.startswith("RuntimeError: GPU 3 fell off the bus (at ")
    assert not false.ok and false.detail == "it returned False"
    assert not hung.ok and hung.detail == "no answer within 0.3s"
    assert not died.ok and died.detail == "the child died (exit code 7)"
    assert str(raised).startswith("_raises: FAILED (RuntimeError: GPU 3 fell off the bus")


class _Counting(HealthPolicy):
    """The built-in policy with one check that fails while ``sick`` and counts its runs."""

    def __init__(self, sick: bool) -> None:
        self.sick, self.runs = sick, 0

    def checks(self):
        self.runs += 1
        return [CallableCheck(lambda: not self.sick)]


def _charged(kind: FailureKind, in_a_row: int) -> ChargedFailures:
    return ChargedFailures("node0", kind, (), charged=in_a_row, in_a_row=in_a_row)


def test_the_health_policy_checks_only_its_own_node_before_a_round():
    policy = _Counting(sick=True)
    assert policy.admit(Candidate("node1")) is ADMITTED and policy.runs == 0  # the sealer's
    admission = policy.admit(Candidate("node0", here=True))
    assert not admission.admitted and policy.runs == 1
    assert admission.cool_off_s == 600.0  # a node refusing itself leaves for the period
    assert admission.reason.startswith("health check '") and "it returned False" in admission.reason


def test_the_health_policy_after_a_failure_charged_to_the_node():
    healthy, sick = _Counting(sick=False), _Counting(sick=True)
    assert healthy.after_failure(_charged(FailureKind.FAILURE, 1)) is STAY
    assert healthy.after_failure(_charged(FailureKind.FAILURE, 2)) == leave(
        "2 failures in a row charged to it", cool_off_s=600.0)
    assert sick.after_failure(_charged(FailureKind.PEER, 0)) is STAY and sick.runs == 0
    verdict = sick.after_failure(_charged(FailureKind.FAILURE, 1))
    assert verdict.leave and "it returned False" in verdict.reason
