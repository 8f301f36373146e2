"""Seeing the run: callbacks, CSV and TensorBoard files, the non-terminal progress
lines, rank-prefixed output, and the run browser (ls/show) on local and S3 runs."""

from __future__ import annotations

import csv
import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest

import elastic_train as et
from elastic_train.callbacks import CSVLoggerCallback, TensorBoardLoggerCallback
from elastic_train.goodput.breakdown import Cause
from elastic_train.storage.run_state import RunStatus
from tests.conftest import EPOCHS, fit
from tests.support.ledger_account import assert_adds_up
from tests.support.paths import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240),
              pytest.mark.usefixtures("no_leaked_processes")]


CLI = [sys.executable, "-m", "elastic_train.cli"]


class Recorder(et.UserCallback):
    def __init__(self):
        self.reports, self.exceptions, self.ended = [], {}, False

    def after_report(self, run_context, metrics, checkpoint):
        self.reports.append((metrics[0]["training_iteration"], checkpoint))

    def after_exception(self, run_context, worker_exceptions):
        self.exceptions.update(worker_exceptions)

    def after_run(self, run_context):
        self.ended = True


def test_callbacks_csv_and_tensorboard(storage, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    recorder = Recorder()
    result = fit(storage, "observed",
                 callbacks=[recorder, CSVLoggerCallback(), TensorBoardLoggerCallback()])
    assert [i for i, _ in recorder.reports] == list(range(1, EPOCHS + 1))
    assert all(c is not None for _, c in recorder.reports) and recorder.ended
    fs = result.filesystem
    csv_lines = fs.cat_file(f"{result.path}/progress.csv").decode().splitlines()
    assert csv_lines[0].startswith("loss,epoch") and len(csv_lines) == EPOCHS + 1
    events = tmp_path / "tb"
    fs.get(f"{result.path}/tensorboard/", str(events) + "/", recursive=True)
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    losses = accumulator.Scalars("loss")
    assert [e.step for e in losses] == list(range(1, EPOCHS + 1))
    assert losses[-1].value == pytest.approx(result.metrics["loss"], rel=1e-5)


def test_after_exception_gets_the_failed_ranks(storage_path, tmp_path):
    recorder = Recorder()
    fault = {"rank": 1, "epoch": 1, "how": "raise", "marker": str(tmp_path / "m")}
    with pytest.raises(et.TrainingFailedError):
        fit(storage_path, "observed-fail", config={"fault": fault}, callbacks=[recorder])
    assert "injected failure" in str(recorder.exceptions[1]) and recorder.ended


def test_bad_callback_is_refused_before_start(storage_path):
    with pytest.raises(et.ConfigError, match="not a UserCallback"):
        fit(storage_path, "bad-callback", callbacks=[print])


def test_piped_output_has_rank_prefixes_and_plain_progress_lines(tmp_path):
    proc = subprocess.run(
        [sys.executable, "examples/digits.py", "--epochs", "3", "--storage-path",
         str(tmp_path), "--name", "piped"],
        cwd=REPO, capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.startswith("[rank0]: epoch 2:") for line in lines)
    status = [line for line in lines if line.startswith("[elastic-train] piped")]
    assert status and "iter 3" in status[-1]
    assert "\r" not in proc.stdout and "\033[" not in proc.stdout  # no terminal codes


def test_ls_and_show_on_finished_failed_and_interrupted_runs(storage, tmp_path):
    fit(storage, "done", config={"epochs": 3, "scores": {"0": 3.0, "1": 1.0, "2": 2.0}},
        checkpoint_config=et.CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="score"))
    fault = {"rank": 0, "epoch": 1, "how": "raise", "marker": str(tmp_path / "m")}
    with pytest.raises(et.TrainingFailedError):
        fit(storage, "broken", config={"fault": fault, "epochs": 2, "upload_mode": "SYNC"})
    run = storage.run("broken")
    state = run.read_run_state()
    state.status = RunStatus.INTERRUPTED  # as Ctrl-C leaves it
    run.write_run_state(state)
    env = {**os.environ}
    if storage.options:
        env.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                   AWS_ENDPOINT_URL=storage.options["endpoint_url"],
                   AWS_DEFAULT_REGION="us-west-2")
    ls = subprocess.run([*CLI, "ls", storage.url, "--json"], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=60)
    assert ls.returncode == 0, ls.stderr
    runs = {r["name"]: r for r in json.loads(ls.stdout)}
    assert {n: r["status"] for n, r in runs.items()} == {"done": "finished",
                                                          "broken": "interrupted"}
    assert runs["done"]["iterations"] == 3
    assert runs["done"]["best_checkpoint"] == "checkpoint_000000"
    table = subprocess.run([*CLI, "ls", storage.url], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=60).stdout
    done_line = next(line for line in table.splitlines() if line.startswith("done "))
    assert done_line.split()[1:4] == ["finished", "3", "0"] and "score=3.0" in done_line
    assert "interrupted" in table
    done = subprocess.run([*CLI, "show", f"{storage.url}/done"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60).stdout
    assert "* checkpoint_000000" in done and "  checkpoint_000002" in done
    assert re.search(r"checkpoint_000002  iteration 3  [\d.]+ KiB from rank 0  ", done)
    assert "deleted: checkpoint_000001" in done and "train:    " in done
    show = subprocess.run([*CLI, "show", f"{storage.url}/broken"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert show.returncode == 0, show.stderr
    assert "rank 0 exit code 1: RuntimeError: injected failure at epoch 1" in show.stdout
    assert "checkpoint_000000" in show.stdout
    missing = subprocess.run([*CLI, "show", str(tmp_path / "nothing")], cwd=REPO,
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_launch_local_ranks_filter(tmp_path):
    proc = subprocess.run([*CLI, "launch", "--standalone", "--nproc-per-node", "2",
                           "--local-ranks-filter", "1", "--storage-path", str(tmp_path),
                           "tests/e2e/scripts/plain_torchrun_script.py"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[rank1]: ENV rank=1" in proc.stdout and "[rank0]:" not in proc.stdout


def test_launch_torchruns_console_and_worker_flags(tmp_path):
    """--role names the workers (ROLE_NAME), --log-line-prefix-template their console
    prefix, -r per local rank keeps rank 0's stdout in its log file only, and --run-path
    with --start-method spawn runs the script path in fresh interpreters."""
    proc = subprocess.run(
        [*CLI, "launch", "--standalone", "--nproc-per-node", "2", "--role", "trainer",
         "--log-line-prefix-template", "${role_name}-${rank}@${hostname}| ", "-r", "0:1",
         "--run-path", "--start-method", "spawn", "--storage-path", str(tmp_path),
         "tests/e2e/scripts/plain_torchrun_script.py"],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    host = socket.gethostname()
    assert f"trainer-1@{host}| ENV rank=1 world=2 sum=2 missing=[] role=trainer" in proc.stdout
    assert "ENV rank=0" not in proc.stdout  # redirected to its log file only
    logs = list(tmp_path.glob("*/logs/**/attempt_0/0/stdout.log"))
    assert len(logs) == 1 and "ENV rank=0" in logs[0].read_text()


def test_resumed_run_gives_callbacks_each_iteration_once(storage_path, tmp_path):
    """fit() again after a failure: callbacks get only the new iterations, and the CSV
    holds the whole history with each iteration once."""
    fault = {"rank": 0, "epoch": 2, "how": "raise", "marker": str(tmp_path / "m")}
    with pytest.raises(et.TrainingFailedError):
        fit(storage_path, "again", config={"fault": fault, "upload_mode": "SYNC"})
    recorder = Recorder()
    result = fit(storage_path, "again", config={"fault": fault},
                 callbacks=[recorder, CSVLoggerCallback()])
    assert [i for i, _ in recorder.reports] == [3, 4, 5]
    with open(os.path.join(result.path, "progress.csv")) as f:
        rows = list(csv.DictReader(f))
    assert [int(r["training_iteration"]) for r in rows] == list(range(1, EPOCHS + 1))


def test_show_gives_recovery_times_and_goodput(storage_path, tmp_path, capsys):
    fault = {"rank": 1, "epoch": 2, "batch": 2, "how": "sigkill", "marker": str(tmp_path / "m")}
    began = time.time()
    result = fit(storage_path, "goodput", max_failures=1,
                 config={"fault": fault, "upload_mode": "SYNC"})
    took = time.time() - began
    ledger = result.goodput
    # The causes add up to the wall time, which is the launch's own (fit() less the
    # Result read after it); no writer left much unaccounted (other). A SIGKILL's time is
    # torch's whole second: its lost work is detection.
    assert_adds_up(ledger, took)
    assert took - 1.0 < ledger.wall_s
    assert ledger.failures == 1 and len(ledger.attempts) == 2 and ledger.checkpoints == EPOCHS
    for cause in (Cause.PRODUCTIVE, Cause.STARTUP, Cause.DETECTION, Cause.RENDEZVOUS,
                  Cause.RESTORE, Cause.CHECKPOINT, Cause.SHUTDOWN):
        assert ledger.seconds[cause] > 0, (cause, ledger)
    assert ledger.seconds[Cause.PREEMPTION] == 0
    assert f"[elastic-train] goodput of goodput: {ledger.describe()}" in capsys.readouterr().out
    show = subprocess.run([*CLI, "show", os.path.join(storage_path, "goodput"), "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert show.returncode == 0, show.stderr
    data = json.loads(show.stdout)
    [recovery] = data["recoveries"]
    assert recovery["kind"] == "failure"
    assert 0 <= recovery["detect_s"] < 30 and 0 < recovery["rendezvous_s"] < 30
    assert 0 < recovery["restore_s"] < 60
    # SYNC: epoch 1's checkpoint was committed before the kill in epoch 2: nothing redone.
    assert recovery["recomputed_iterations"] == 0
    assert data["goodput"] == pytest.approx(ledger.ettr) and 0 < data["goodput"] < 1
    assert data["ledger"]["seconds"] == pytest.approx({c.value: s for c, s in
                                                       ledger.seconds.items()})
    assert data["checkpoint_interval"]["optimum_s"] > 0
    assert data["checkpoints"][-1]["ranks"] == [0] and data["checkpoints"][-1]["size_bytes"] > 0
    text = subprocess.run([*CLI, "show", os.path.join(storage_path, "goodput")], cwd=REPO,
                          capture_output=True, text=True, timeout=60).stdout
    assert "recovery: detected in" in text and "goodput:  ETTR" in text
    assert "recompute" in text and "Young/Daly's optimum" in text
