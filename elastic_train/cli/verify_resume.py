"""``elastic-train verify-resume``: does *your* training resume exactly?

Runs the user's launch script twice on this machine: once straight through,
once with a worker killed right after its K-th ``report()`` (then restarted
from the latest checkpoint, as after a real crash; the crash is injected by
:mod:`elastic_train.worker.fault_injection`). If the final committed
checkpoints of both runs have the same files with the same CRC-32s, the
script resumes bit-identically; otherwise the differing files are named, which
points at state the checkpoint does not carry (an RNG, a data-loader position,
a learning-rate scheduler...).

    elastic-train verify-resume --nproc-per-node 2 --fail-at-report 3 train.py --epochs 5
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from elastic_train._internal import env_vars
from elastic_train.cli.launch_command import launch_settings
from elastic_train.errors import ConfigError
from elastic_train.storage import RunStorage
from elastic_train.storage.manifest import CommitManifest

RUNS = ("straight", "interrupted")
_TAIL_LINES = 30  # of a failed launch's output, shown on stderr


@dataclass
class Verdict:
    identical: bool
    resumed: bool
    differing: list[str]
    straight: CommitManifest | None
    resumed_run: CommitManifest | None
    crash_at: int = 0
    failed: str = ""  # a launch that failed: which, and where its output is
    kept_in: str | None = None  # where both runs are, when they are kept

    @property
    def passed(self) -> bool:
        return self.identical and self.resumed and not self.failed

    def describe(self) -> str:
        kept = f" The runs are in {self.kept_in}." if self.kept_in and not self.failed else ""
        return self._verdict() + kept

    def _verdict(self) -> str:
        if self.failed:
            return f"FAILED: {self.failed}."
        if self.straight is None or self.resumed_run is None:
            return ("FAILED: a run committed no checkpoint; report() a checkpoint at least "
                    "at the end of training.")
        if not self.resumed:
            return ("INCONCLUSIVE: no failure was injected (the script reported fewer times "
                    "than --fail-at-report); lower it.")
        if self.identical:
            return (f"OK: after a crash at report {self.crash_at}, the resumed run's final "
                    f"checkpoint is bit-identical to the uninterrupted run's "
                    f"({len(self.straight.files)} files).")
        return ("DIFFERENT: the resumed run's final checkpoint differs in "
                f"{', '.join(self.differing)}: some state is not saved in (or not restored "
                "from) the checkpoint -- RNG states, the data order, a scheduler...")


def _final(storage_path: str, name: str) -> tuple[CommitManifest | None, int]:
    storage = RunStorage.open(storage_path, name)
    committed = storage.checkpoints.committed()
    state = storage.read_run_state()
    return (committed[-1] if committed else None), len(state.failures) if state else 0


def _refuse_used_workdir(storage: str) -> None:
    for name in RUNS:  # a stored one would be continued, not redone
        if RunStorage.open(storage, name).read_run_state() is not None:
            raise ConfigError(f"--workdir {storage} already holds a run {name!r} of an earlier "
                              "verify-resume: pass an empty directory, or none for a new "
                              "temporary one.")


def _run_launch(argv: list[str], env: dict[str, str], log_path: str) -> str:
    """Runs ``elastic-train launch ARGV`` with its output in ``log_path`` (a passing run
    stays quiet: the injected crash's messages are expected); on a failure its last
    lines go to stderr and the answer says what failed, else it is empty."""
    with open(log_path, "w") as log:
        code = subprocess.run([sys.executable, "-m", "elastic_train.cli", "launch", *argv],
                              env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    if code == 0:
        return ""
    with open(log_path) as log:
        print("".join(log.readlines()[-_TAIL_LINES:]), end="", file=sys.stderr)
    return f"the launch exited with code {code}; its output is in {log_path}"


def verify(script_and_args: list[str], nproc_per_node: int, fail_at_report: int,
           workdir: str | None = None) -> Verdict:
    """Runs both launches (subprocesses of ``elastic-train launch``) and compares them.

    Their command line is checked first, so that a mistake (a missing script, a bad
    flag) is a ConfigError before anything starts. A temporary directory of ours is
    removed when the script passes and kept (and named) otherwise; a ``workdir`` given
    is the user's and stays."""
    base = ["--standalone", "--quiet", "--nproc-per-node", str(nproc_per_node)]
    launch_settings([*base, "--storage-path", workdir or tempfile.gettempdir(),
                     *script_and_args], os.environ)
    if workdir is not None:
        _refuse_used_workdir(workdir)
        os.makedirs(workdir, exist_ok=True)  # for the launches' logs
    storage = workdir or tempfile.mkdtemp(prefix="elastic_train_verify_")
    verdict = None
    try:
        verdict = _verify_in(storage, [*base, "--storage-path", storage], script_and_args,
                             fail_at_report)
    finally:
        if workdir is None and (verdict is None or verdict.passed):
            shutil.rmtree(storage, ignore_errors=True)
    verdict.kept_in = storage if workdir is None and not verdict.passed else None
    return verdict


def _verify_in(storage: str, base: list[str], script_and_args: list[str],
               fail_at_report: int) -> Verdict:
    for name, extra, env in (
        ("straight", [], {}),
        ("interrupted", ["--max-restarts", "1"], {env_vars.FAIL_AT_REPORT: str(fail_at_report)}),
    ):
        print(f"verify-resume: {name} run ...", flush=True)
        failed = _run_launch([*base, *extra, "--name", name, *script_and_args],
                             {**os.environ, **env}, os.path.join(storage, f"{name}.log"))
        if failed:
            return Verdict(False, False, [], None, None, failed=f"the {name} run failed: "
                                                                f"{failed}")
    straight, _ = _final(storage, "straight")
    resumed_run, failures = _final(storage, "interrupted")
    differing = []
    if straight and resumed_run:
        names = sorted(set(straight.files) | set(resumed_run.files))
        differing = [n for n in names if straight.files.get(n) != resumed_run.files.get(n)]
    return Verdict(identical=bool(straight and resumed_run) and not differing,
                   resumed=failures > 0, differing=differing, straight=straight,
                   resumed_run=resumed_run, crash_at=fail_at_report)
