"""Bad input through the command line, tried for real: each case gets a clear error
(exit code 2, the bad value and the fix named) and leaves stored runs untouched."""

from __future__ import annotations

import json
import os

import pytest

from elastic_train.cli.main import main
from tests.conftest import child_pids
from tests.support.file_tree import snapshot
from tests.support.paths import REPO

SCRIPT = "tests/e2e/scripts/plain_torchrun_script.py"

CASES = [
    ("nnodes-0", ["launch", "--nnodes", "0", SCRIPT], ["--nnodes='0'", "MIN:MAX"]),
    ("nnodes-inverted", ["launch", "--nnodes", "4:2", SCRIPT], ["--nnodes='4:2'"]),
    ("nproc-0", ["launch", "--nproc-per-node", "0", SCRIPT], ["--nproc-per-node=0"]),
    ("rdzv-conf", ["launch", "--rdzv-conf", "timeout", SCRIPT], ["'timeout'", "key=value"]),
    ("rdzv-backend", ["launch", "--rdzv-backend", "zookeeper", SCRIPT],
     ["'zookeeper'", "c10d"]),
    ("rdzv-endpoint", ["launch", "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-id", "j",
                       "--rdzv-endpoint",
                       "127.0.0.1:notaport", SCRIPT], ["'127.0.0.1:notaport'", "HOST:PORT"]),
    ("rdzv-id-missing", ["launch", "--nnodes", "2", "--rdzv-backend", "c10d",
                         "--rdzv-endpoint", "h:29400", SCRIPT],
     ["--rdzv-id is required"]),
    ("no-script", ["launch", "no_such_script.py"], ["'no_such_script.py' does not exist"]),
    # Flags are checked by the configs they map to, as the Python API's settings are.
    ("hang-timeout", ["launch", "--hang-timeout", "-1", SCRIPT],
     ["--hang-timeout=-1.0", "> 0", "omit --hang-timeout"]),
    ("preemption-grace", ["launch", "--preemption-grace", "-5", SCRIPT],
     ["--preemption-grace=-5.0", ">= 0"]),
    ("max-preemption-failures", ["launch", "--max-preemption-failures", "-7", SCRIPT],
     ["--max-preemption-failures=-7"]),
    ("max-restarts", ["launch", "--max-restarts", "-2", SCRIPT],
     ["--max-restarts=-2", "-1 for unlimited"]),
    ("master-port", ["launch", "--rdzv-backend", "static", "--master-port", "99999", SCRIPT],
     ["--master-addr/--master-port", "'127.0.0.1:99999'", "0 to 65535"]),
    ("num-to-keep", ["launch", "--num-to-keep", "0", SCRIPT],
     ["--num-to-keep=0", "omit --num-to-keep"]),
    ("peer-replicas", ["launch", "--peer-replicas", "-1", SCRIPT],
     ["--peer-replicas=-1", ">= 0"]),
    ("name-slash", ["launch", "--name", "a/b", SCRIPT], ["--name", "'a/b'"]),
    ("storage-protocol", ["launch", "--storage-path", "nosuchproto://bucket/x", SCRIPT],
     ["'nosuchproto://bucket/x'", "Protocol not known"]),
    ("finished-run", ["launch", "--storage-path", "{root}", "--name", "finished", SCRIPT],
     ["already finished", "--start-over"]),
    ("restore-finished", ["restore", "{root}/finished"], ["already finished", "--start-over"]),
    ("verify-used-workdir", ["verify-resume", "--workdir", "{root}", SCRIPT],
     ["already holds a run 'straight'", "empty directory"]),
    ("newer-run-json", ["restore", "{root}/newer"], ["format_version 99", "upgrade"]),
    ("restore-no-trainable", ["restore", "{root}/no_trainable"],
     ["trainable.pkl) is missing, though run.json is there", "Run the script"]),
    ("restore-not-a-run", ["restore", "{root}"], ["not a run directory (no run.json)"]),
    ("show-not-a-run", ["show", "{root}"], ["not a run directory", "elastic-train ls"]),
    ("show-missing", ["show", "{root}/nothing"], ["nothing does not exist", "check the path"]),
    ("show-corrupt", ["show", "{root}/corrupt"], ["run.json is not valid JSON", "move the run"]),
    ("ls-missing", ["ls", "{root}/nothing"], ["nothing does not exist"]),
    ("ls-protocol", ["ls", "nosuchproto://x"], ["'nosuchproto://x'"]),
    ("show-storage-option", ["show", "{root}/finished", "--storage-option", "x"],
     ["'x'", "KEY=VALUE"]),
    ("storage-option", ["restore", "{root}/finished", "--storage-option", "endpoint"],
     ["'endpoint'", "KEY=VALUE"]),
]


@pytest.fixture
def stored_runs(tmp_path):
    """A storage path holding finished runs, one written by a newer version and one whose
    trainable.pkl is gone."""
    root = tmp_path / "results"
    for name, state in (("finished", {"status": "finished", "format_version": 1}),
                        ("newer", {"status": "running", "format_version": 99}),
                        ("straight", {"status": "finished", "format_version": 1}),
                        ("no_trainable", {"status": "interrupted", "format_version": 1,
                                          "spec": {"train_function": "train:loop"}})):
        (root / name / "checkpoint_000000").mkdir(parents=True)
        (root / name / "run.json").write_text(json.dumps(state))
        (root / name / "checkpoint_000000" / "state.pt").write_bytes(b"weights")
    (root / "corrupt").mkdir()
    (root / "corrupt" / "run.json").write_text('{"status": "runn')  # a write cut short
    return root


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args, words", [pytest.param(a, w, id=i) for i, a, w in CASES])
def test_bad_cli_input_exits_2_with_the_fix_and_touches_nothing(args, words, stored_runs,
                                                                 capsys, monkeypatch):
    """The command's own entry point, in this process (an exception would fail the test
    where the command would print a traceback); no worker may start."""
    monkeypatch.chdir(REPO)
    before, pids = snapshot(stored_runs), set(child_pids(os.getpid()))
    try:
        code = main([a.format(root=stored_runs) for a in args])
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1, err  # one line
    assert err.startswith("elastic-train: ") or args[0] == "restore", err
    for word in words:
        assert word in err
    assert snapshot(stored_runs) == before
    assert set(child_pids(os.getpid())) <= pids
