"""What a user is told when the train function fails: the exit code as the process
would have ended, a process that left no exception said so, retry advice only where a
retry can help, one line per failed attempt with one budget count."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest

import elastic_train as et
from elastic_train.errors import TrainingFailedError
from elastic_train.torch import TorchTrainer
from tests.conftest import start_driver, stop_driver_after_commit, wait_until
from tests.support import message_jobs
from tests.support.full_disk import FullDiskFS
from tests.support.paths import REPO
from tests.support.servers import free_port, stop_process

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120),
              pytest.mark.usefixtures("no_leaked_processes")]

RETRY = "To retry automatically"


def _fail(storage_path: str, name: str, max_failures: int = 0,
          hang_timeout_s: float | None = None, **config) -> str:
    """fit() of :func:`message_jobs.fail`; the TrainingFailedError's message."""
    failure = et.FailureConfig(max_failures=max_failures, hang_timeout_s=hang_timeout_s)
    trainer = TorchTrainer(
        message_jobs.fail, train_loop_config=config,
        scaling_config=et.ScalingConfig(num_workers=2),
        run_config=et.RunConfig(name=name, storage_path=storage_path,
                                failure_config=failure))
    with pytest.raises(TrainingFailedError) as info:
        trainer.fit()
    return str(info.value)


def _state(storage_path: str, name: str) -> dict:
    with open(os.path.join(storage_path, name, "run.json")) as f:
        return json.load(f)


def test_retry_advice_only_where_a_retry_can_help(storage_path):
    """An exception before the first report() of the first attempt comes back on every
    retry: the message says to fix it. The same exception after a report may pass."""
    first = _fail(storage_path, "first-step", how="raise")
    assert RETRY not in first and "a retry would most likely meet it again" in first, first
    later = _fail(storage_path, "after-report", how="raise", after_report=True)
    assert RETRY in later, later


def test_exit_codes_and_a_process_without_an_exception(storage_path):
    """sys.exit(3) is exit code 3 (not 1); os._exit(1) is said to be an exit without a
    Python exception -- not torch's "To enable traceback see: <url>" -- in the error,
    run.json and `elastic-train show`."""
    assert "rank 1 (local rank 1" in (exit3 := _fail(storage_path, "exit3", how="exit3"))
    assert "exited with code 3." in exit3.splitlines()[0], exit3
    message = _fail(storage_path, "os-exit", how="os_exit")
    headline = message.splitlines()[0]
    assert headline.endswith("exited with code 1 without a Python exception."), message
    state = _state(storage_path, "os-exit")
    assert "To enable traceback" not in json.dumps(state), state
    shown = subprocess.run([sys.executable, "-m", "elastic_train.cli", "show",
                            os.path.join(storage_path, "os-exit")], cwd=REPO, text=True,
                           capture_output=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    failure = next(line for line in shown.stdout.splitlines() if "[failure]" in line)
    assert failure.endswith("rank 1 exit code 1: without a Python exception"), shown.stdout
    assert "To enable traceback" not in shown.stdout, shown.stdout


def test_a_hung_rank_is_said_to_have_hung_where_it_was_stuck(storage_path):
    """A rank asleep past FailureConfig(hang_timeout_s): the raised error says what the
    console's HangError says -- the hang, for how long, where it was stuck -- not "killed by
    SIGKILL", and its stack leads with the train function's thread, not the project's own."""
    message = _fail(storage_path, "hung", hang_timeout_s=5, how="sleep", after_report=True)
    lines = message.splitlines()
    assert "rank 1 (local rank 1" in lines[0] and "hung and was stopped by the hang watch" \
        in lines[0] and "SIGKILL" not in lines[0], message
    with open(message_jobs.__file__) as f:
        line = next(n for n, text in enumerate(f, 1) if text.strip().startswith("time.sleep"))
    assert lines[2].startswith("HangError: rank 1 made no progress (no report() or batch)"), \
        message
    assert f"stuck at message_jobs.py:{line} fail" in lines[2], message
    stack = message.split("Traceback of rank 1:", 1)[1]
    first = next(text for text in stack.splitlines() if 'File "' in text)
    assert f'message_jobs.py", line {line} in fail' in first, message
    shown = subprocess.run([sys.executable, "-m", "elastic_train.cli", "show",
                            os.path.join(storage_path, "hung")], cwd=REPO, text=True,
                           capture_output=True, timeout=60)
    failure = next(line for line in shown.stdout.splitlines() if "[failure]" in line)
    assert "rank 1 hung: HangError: rank 1 made no progress" in failure, shown.stdout


def test_a_store_that_fills_up_fails_fast_saying_so(tmp_path, caplog):
    """The disk fills mid-run: fit() raises the workers' TrainingFailedError at once, which
    says the storage is full and where, not a raw OSError from the clean-up's lease
    release; what the driver could not write is said in one line each, no tracebacks."""
    fs = FullDiskFS(str(tmp_path / "full"))
    trainer = TorchTrainer(
        message_jobs.fill_the_disk, train_loop_config={"fs": fs},
        scaling_config=et.ScalingConfig(num_workers=2),
        run_config=et.RunConfig(name="full", storage_path=str(tmp_path / "results"),
                                storage_filesystem=fs))
    started = time.monotonic()
    with caplog.at_level(logging.WARNING), pytest.raises(TrainingFailedError) as info:
        trainer.fit()
    assert time.monotonic() - started < 30
    message = str(info.value)
    assert "failed: the storage is full (No space left on device, writing " \
        f"{tmp_path / 'results' / 'full'}" in message, message
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []


def test_one_line_per_failure_with_one_budget_count(storage_path, caplog):
    """max_failures=2: three failed attempts, each logged once; the two restarts say what
    is left after them (as run.json's restarts_left), only the last says the run stops."""
    with caplog.at_level(logging.WARNING):
        _fail(storage_path, "budget", max_failures=2, how="raise")
    said = [r.getMessage() for r in caplog.records if "Worker group failed" in r.getMessage()]
    assert len(said) == 3, said
    assert said[0].endswith("restarting; 1 restart(s) left after this one."), said
    assert said[1].endswith("restarting; no restart(s) left after this one."), said
    assert said[2].endswith("no restart left: the run stops."), said
    assert [f["restarts_left"] for f in _state(storage_path, "budget")["failures"]] == [1, 0, 0]


@pytest.mark.timeout(90)
def test_a_survivor_of_a_peers_failure_prints_one_line(tmp_path):
    """`launch`: rank 1 raises while rank 0 waits in a barrier; rank 0's gloo error is one
    line on the console, not its 8-25 line traceback; rank 1's traceback is shown whole."""
    script = tmp_path / "fails.py"
    script.write_text("import sys\nimport torch.distributed as dist\n"
                      "dist.init_process_group('gloo')\n"
                      "if dist.get_rank() == 1:\n    raise ValueError('a mistake')\n"
                      "dist.barrier()\n")
    out = subprocess.run(
        [sys.executable, "-m", "elastic_train.cli", "launch", "--nproc-per-node", "2",
         "--storage-path", str(tmp_path / "results"), str(script)],
        cwd=REPO, text=True, capture_output=True, timeout=80)
    assert out.returncode == 1, out.stderr
    console = out.stdout + out.stderr
    rank0 = [line for line in console.splitlines() if line.startswith("[rank0]")]
    assert len(rank0) == 1 and "a peer may have failed first" in rank0[0], console
    assert "[rank1]: ValueError: a mistake" in console, console
    assert RETRY not in console, console


@pytest.mark.timeout(200)
def test_a_run_whose_driver_was_killed_is_shown_interrupted(storage_path, tmp_path):
    """(i) The driver killed with SIGKILL never writes its end: run.json keeps saying
    "running", but its lease's holder is a dead process on this host, so `ls` and
    `show` say "interrupted"."""
    driver = start_driver(storage_path, "killed", tmp_path)
    run_dir = os.path.join(storage_path, "killed")
    stop_driver_after_commit(driver, run_dir, 0, signal.SIGKILL)
    assert _state(storage_path, "killed")["status"] == "running"
    for args in (["show", run_dir], ["ls", storage_path]):
        out = subprocess.run([sys.executable, "-m", "elastic_train.cli", *args], cwd=REPO,
                             text=True, capture_output=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "interrupted" in out.stdout and "running" not in out.stdout, out.stdout


def test_a_reported_training_iteration_is_replaced_with_a_warning(storage_path, capfd):
    """(j) report({"training_iteration": 100}): the row keeps the count of reports (as
    Ray's), and each worker says once that its value was replaced and what to do."""
    result = TorchTrainer(
        message_jobs.report_own_iteration, scaling_config=et.ScalingConfig(num_workers=2),
        run_config=et.RunConfig(name="own-iteration", storage_path=storage_path)).fit()
    assert result.metrics["training_iteration"] == 2
    out = "".join(capfd.readouterr())
    said = [line for line in out.splitlines() if "'training_iteration' is a field" in line]
    assert len(said) == 2, out  # once per worker, not per report
    assert "100, is replaced" in said[0] and "'my_training_iteration'" in said[0], said


@pytest.mark.timeout(150)
def test_restore_of_a_fit_run_from_another_directory_names_the_module_and_where(tmp_path):
    """(j) A fit() run whose train function lives in the module fns of the directory it
    was started in, restored from elsewhere: one line naming fns and that directory."""
    started = tmp_path / "project"
    started.mkdir()
    (started / "fns.py").write_text("def train(config):\n    raise ValueError('stop')\n")
    results = tmp_path / "results"
    fit = ("import elastic_train as et, fns\nfrom elastic_train.torch import TorchTrainer\n"
           "try:\n    TorchTrainer(fns.train, scaling_config=et.ScalingConfig(num_workers=1),"
           f" run_config=et.RunConfig(name='r', storage_path={str(results)!r})).fit()\n"
           "except et.TrainingFailedError:\n    pass\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ran = subprocess.run([sys.executable, "-c", fit], cwd=started, env=env, text=True,
                         capture_output=True, timeout=120)
    assert ran.returncode == 0 and _state(str(results), "r")["status"] == "failed", ran.stderr
    out = subprocess.run([sys.executable, "-m", "elastic_train.cli", "restore",
                          str(results / "r")], cwd=tmp_path, env=env, text=True,
                         capture_output=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    assert "the module 'fns'" in out.stderr and f"from {started}," in out.stderr, out.stderr


@pytest.mark.timeout(150)
def test_ctrl_c_on_fit_says_one_thing(storage_path):
    """(k) Ctrl-C (SIGINT to the terminal's process group: the driver, its agent and the
    workers) once training runs: the run stops resumable and says so, without torch's
    "death signal" warning or a KeyboardInterrupt traceback from every rank."""
    driver = subprocess.Popen([sys.executable, "-m", "tests.support.message_jobs",
                               storage_path, "ctrl-c"], cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        metrics = os.path.join(storage_path, "ctrl-c", "metrics.jsonl")
        assert wait_until(lambda: os.path.exists(metrics) and os.path.getsize(metrics) > 0,
                          120), "no report"
        os.killpg(driver.pid, signal.SIGINT)
        out, _ = driver.communicate(timeout=60)
    finally:
        stop_process(driver)
    assert driver.returncode != 0
    assert "Run interrupted by SIGINT" in out, out
    assert "death signal" not in out, out
    assert not [line for line in out.splitlines() if line.startswith("[rank")
                and "KeyboardInterrupt" in line], out


@pytest.mark.timeout(90)
def test_an_etcd_endpoint_where_nothing_listens_is_said_to_be_waited_for(tmp_path):
    """(k) `launch --rdzv-backend etcd` at an endpoint where nothing listens waits up to
    its join timeout before the (clear) error: meanwhile its status says what it waits
    for, not "starting"."""
    script = tmp_path / "hi.py"
    script.write_text("print('hi')\n")
    endpoint = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "elastic_train.cli", "launch", "--rdzv-backend", "etcd",
         "--rdzv-endpoint", endpoint, "--rdzv-id", "nowhere", "--storage-path",
         str(tmp_path / "results"), str(script)],
        cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        status = next(line for line in proc.stdout if line.startswith("[elastic-train]"))
    finally:
        stop_process(proc)
    assert f"waiting for the rendezvous (etcd at {endpoint})" in status, status
