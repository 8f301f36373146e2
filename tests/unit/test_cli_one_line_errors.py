"""Users' mistakes on the command line, through the real entry point
(``python -m elastic_train.cli``): each ends at once with exit code 2 and one line
that names the real cause and the fix in the command line's own terms, and leaves no
run directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.timeout(120)


def cli(*args: str, cwd: str | os.PathLike = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "elastic_train.cli", *args], cwd=cwd,
                          env=env, text=True, capture_output=True, timeout=100)


@pytest.fixture
def workdir(tmp_path):
    """A directory with a script that does not compile, a file, a package directory and
    a run."""
    (tmp_path / "broken.py").write_text("import os\nx = (1,\nprint(x)\n")
    (tmp_path / "notes.txt").write_text("not a run\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text("print('hi')\n")
    run = tmp_path / "results" / "run1"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"status": "failed", "format_version": 1}))
    return tmp_path


CASES = [
    # (d) checked before any process starts
    ("syntax-error", ["launch", "--storage-path", "results", "broken.py"],
     ["'broken.py' has a syntax error at line 2", "Fix it"]),
    ("missing-module", ["launch", "--storage-path", "results", "-m", "no_such_module_xyz"],
     ["no module named 'no_such_module_xyz'", "PYTHONPATH"]),
    # (e) the flags' names, not the Python API's
    ("num-to-keep", ["launch", "--num-to-keep", "0", "pkg/train.py"],
     ["--num-to-keep=0", "omit --num-to-keep"]),
    ("name", ["launch", "--name", "a/b", "pkg/train.py"], ["--name='a/b'", "e.g. --name "]),
    ("hang-timeout", ["launch", "--hang-timeout", "-1", "pkg/train.py"],
     ["--hang-timeout=-1.0", "omit --hang-timeout"]),
    # (f) paths: the real cause and the fix
    ("launch-dir", ["launch", "--storage-path", "results", "pkg"],
     ["'pkg' is a directory", "pkg/train.py"]),
    ("ls-file", ["ls", "notes.txt"], ["notes.txt is a file, not a storage path",
                                      "directory that holds the runs"]),
    ("show-file", ["show", "notes.txt"], ["notes.txt is a file, not a run directory"]),
    ("show-run-json", ["show", "results/run1/run.json"],
     ["is a file, not a run directory", "results/run1 "]),
    ("restore-missing", ["restore", "results/nothing"], ["nothing does not exist",
                                                         "check the path"]),
    ("restore-file", ["restore", "notes.txt"], ["notes.txt is a file, not a run directory"]),
]


@pytest.mark.parametrize("args, words", [pytest.param(a, w, id=i) for i, a, w in CASES])
def test_a_mistake_exits_2_with_one_line(args, words, workdir):
    before = sorted(p.name for p in (workdir / "results").iterdir())
    out = cli(*args, cwd=workdir)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("elastic-train: ") and out.stderr.count("\n") == 1, out.stderr
    for word in words:
        assert word in out.stderr, out.stderr
    assert "Config" not in out.stderr and "None" not in out.stderr, out.stderr
    assert sorted(p.name for p in (workdir / "results").iterdir()) == before


def _undocumented(help_text: str) -> list[str]:
    """The arguments of an argparse --help without a description: an entry line (two
    spaces, then the argument) followed by neither its text nor an indented line."""
    lines = help_text.splitlines()
    bare, listing = [], False
    for i, line in enumerate(lines):
        if line and not line.startswith(" "):  # a section: arguments, options, examples
            listing = line.endswith(("arguments:", "options:"))
        if not listing or not line.startswith("  ") or line.startswith("   "):
            continue
        entry, _, text = line[2:].partition("  ")
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if not text.strip() and not following.startswith(" " * 6):
            bare.append(entry)
    return bare


@pytest.mark.parametrize("command", ["ls", "show", "restore", "verify-resume", "launch"])
def test_every_argument_of_help_is_described(command):
    """(g) Every positional argument and flag of a command's --help says what it is;
    ls shows its default storage path."""
    out = cli(command, "--help")
    assert out.returncode == 0, out.stderr
    assert _undocumented(out.stdout) == [], out.stdout
    if command == "ls":
        assert "(default ~/elastic_train_results)" in " ".join(out.stdout.split())


def test_show_counts_a_long_runs_deleted_checkpoints(tmp_path):
    """(h) 58 checkpoints deleted by retention: one line with their count and range, not
    58 names."""
    run = tmp_path / "long"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"status": "finished", "format_version": 1}))
    rows = [{"training_iteration": i + 1, "checkpoint_dir_name": f"checkpoint_{i:06d}"}
            for i in range(58)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = cli("show", str(run))
    assert out.returncode == 0, out.stderr
    deleted = [line for line in out.stdout.splitlines() if "deleted:" in line]
    assert deleted == ["  deleted: 58, checkpoint_000000 to checkpoint_000057 "
                       "(`show --json` lists them)"], out.stdout


def test_a_launch_script_run_with_plain_python_is_told_to_use_launch(tmp_path):
    """(j) A script written for `elastic-train launch`, run with `python script.py`."""
    script = tmp_path / "train.py"
    script.write_text("import elastic_train as et\net.report({'loss': 1.0})\n")
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, text=True,
                         capture_output=True, timeout=100,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 1
    assert "`elastic-train launch SCRIPT`" in out.stderr.splitlines()[-1], out.stderr


def test_fit_to_s3_without_credentials_says_so_in_a_short_traceback(tmp_path):
    """(k) fit() to an s3:// path with no credentials anywhere: the error names the
    credentials to set (as `ls` does), and the store's own traceback (60 lines of
    botocore's) is not chained to it. No worker starts: the driver checks first."""
    script = tmp_path / "fit_s3.py"
    script.write_text(
        "import elastic_train as et\nfrom elastic_train.torch import TorchTrainer\n"
        "def train(config):\n    et.report({'x': 1})\n"
        "TorchTrainer(train, run_config=et.RunConfig(name='r', storage_path='s3://bucket/x',"
        " storage_options={'endpoint_url': 'http://127.0.0.1:9'})).fit()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(PYTHONPATH=str(REPO), AWS_EC2_METADATA_DISABLED="true",
               AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"))
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, text=True,
                         capture_output=True, timeout=100)
    assert out.returncode == 1
    last = out.stderr.splitlines()[-1]
    assert "NoCredentialsError" in last and "AWS_ACCESS_KEY_ID" in last, out.stderr
    assert "direct cause" not in out.stderr and "botocore" not in out.stderr, out.stderr
