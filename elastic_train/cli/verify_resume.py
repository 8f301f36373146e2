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
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from elastic_train import env_vars
from elastic_train.errors import ConfigError
from elastic_train.storage import RunStorage
from elastic_train.storage.manifest import CommitManifest


@dataclass
class Verdict:
    identical: bool
    resumed: bool
    differing: list[str]
    straight: CommitManifest | None
    resumed_run: CommitManifest | None

    def describe(self) -> str:
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

    crash_at: int = 0


def _final(storage_path: str, name: str) -> tuple[CommitManifest | None, int]:
    storage = RunStorage.open(storage_path, name)
    committed = storage.checkpoints.committed()
    state = storage.read_run_state()
    return (committed[-1] if committed else None), len(state.failures) if state else 0


def verify(script_and_args: list[str], nproc_per_node: int, fail_at_report: int,
           workdir: str | None = None) -> Verdict:
    """Runs both launches (subprocesses of ``elastic-train launch``) and compares them."""
    storage = workdir or tempfile.mkdtemp(prefix="elastic_train_verify_")
    for name in ("straight", "interrupted"):  # a stored one would be continued, not redone
        if RunStorage.open(storage, name).read_run_state() is not None:
            raise ConfigError(f"--workdir {storage} already holds a run {name!r} of an earlier "
                              "verify-resume: pass an empty directory, or none for a new "
                              "temporary one.")
    base = [sys.executable, "-m", "elastic_train.cli", "launch", "--standalone", "--quiet",
            "--nproc-per-node", str(nproc_per_node), "--storage-path", storage]
    for name, extra, env in (
        ("straight", [], {}),
        ("interrupted", ["--max-restarts", "1"], {env_vars.FAIL_AT_REPORT: str(fail_at_report)}),
    ):
        print(f"verify-resume: {name} run ...", flush=True)
        subprocess.run([*base, *extra, "--name", name, *script_and_args],
                       env={**os.environ, **env}, check=True)
    straight, _ = _final(storage, "straight")
    resumed_run, failures = _final(storage, "interrupted")
    differing = []
    if straight and resumed_run:
        names = sorted(set(straight.files) | set(resumed_run.files))
        differing = [n for n in names if straight.files.get(n) != resumed_run.files.get(n)]
    verdict = Verdict(identical=bool(straight and resumed_run) and not differing,
                      resumed=failures > 0, differing=differing, straight=straight,
                      resumed_run=resumed_run)
    verdict.crash_at = fail_at_report
    return verdict
