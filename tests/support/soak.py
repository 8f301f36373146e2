"""The soak: one run of the restart job with N faults, checked against a fault-free run.

``python -m tests.support.soak FAULTS STORAGE_DIR OUT_JSON`` (what ``python -m bench
--only soak`` runs), or :func:`soak` (``tests/e2e/test_soak.py``, long profile).
Rank 1 fails in each of the first N attempts, cycling through an exception, a
SIGKILL and an exit, after each attempt has committed a checkpoint (so every
restart makes progress); rank 0 never fails and records, at the start of each
attempt, its open descriptors, threads, child processes and resident memory.

What comes out (:class:`SoakResult`): whether the run finished, whether its final
weights are bit-identical to the fault-free run's, how many checkpoints a
``report()`` returned for but storage does not hold intact ("lost"), how the
restarts went, and the survivor's resources at the start of the second attempt
and of the last.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import asdict, dataclass, field

import torch

import elastic_train as et
from elastic_train.storage import RunStorage
from elastic_train.storage.checkpoint_store import mismatched_files
from elastic_train.torch import TorchTrainer
from tests.support import restart_job

KINDS = ("raise", "sigkill", "exit")
BATCHES_PER_ATTEMPT = 4  # a checkpoint every 4 batches; the fault comes at the 5th


@dataclass
class SoakResult:
    faults: int
    finished: bool = False
    identical: bool = False
    lost_checkpoints: int = 0
    failures_recorded: int = 0
    in_process: int = 0
    replaced: int = 0
    recovery_median_s: float | None = None
    recovery_max_s: float | None = None
    second: dict = field(default_factory=dict)  # the survivor at the 2nd attempt's start
    last: dict = field(default_factory=dict)  # ... and at the last attempt's

    @property
    def rss_growth(self) -> float | None:
        if not self.second or not self.last:
            return None
        return self.last["rss_kb"] / self.second["rss_kb"] - 1


def _config(faults: int, scheduled: int, probe_file: str | None) -> dict:
    """The job with ``scheduled`` faults, long enough for ``faults`` attempts to make
    progress (the fault-free run is the same job with none)."""
    batches = (faults + 2) * BATCHES_PER_ATTEMPT
    return {"epochs": -(-batches // 16), "num_workers": 2, "checkpoint_every": BATCHES_PER_ATTEMPT,
            "fail_after": BATCHES_PER_ATTEMPT + 1, "probe_file": probe_file,
            "faults": {str(i): KINDS[i % len(KINDS)] for i in range(scheduled)}}


def _fit(storage_path: str, name: str, config: dict) -> et.Result:
    return TorchTrainer(
        restart_job.train_with_faults, train_loop_config=config,
        scaling_config=et.ScalingConfig(num_workers=2),
        run_config=et.RunConfig(storage_path=storage_path, name=name, verbose=0,
                                failure_config=et.FailureConfig(max_failures=-1)),
    ).fit()


def lost_checkpoints(storage: RunStorage) -> int:
    """Checkpoints a report() returned for (SYNC: committed first) that storage does not
    hold intact now (retention keeps them all in this job)."""
    committed = {c.index: c for c in storage.checkpoints.committed()}
    lost = 0
    for row in storage.read_metrics():
        name = row.get("checkpoint_dir_name")
        if not name:
            continue
        manifest = committed.get(int(name.rsplit("_", 1)[1]))
        lost += manifest is None or bool(mismatched_files(
            storage.checkpoints.path(manifest.index), manifest))
    return lost


def soak(faults: int, storage_path: str, probe_file: str) -> SoakResult:
    straight = _fit(storage_path, "straight", _config(faults, 0, None))
    result = SoakResult(faults)
    try:
        faulty = _fit(storage_path, "soak", _config(faults, faults, probe_file))
    except et.TrainingFailedError:
        return result
    result.finished = True
    result.identical = all(torch.equal(v, faulty.return_value["weights"][k])
                           for k, v in straight.return_value["weights"].items())
    storage = RunStorage.open(storage_path, "soak")
    result.lost_checkpoints = lost_checkpoints(storage)
    failures = storage.read_run_state().failures
    result.failures_recorded = len(failures)
    result.in_process = sum(f.restart == "in-process" for f in failures)
    result.replaced = sum(len(f.replaced) for f in failures)
    times = [f.rendezvous_at - f.failed_at for f in failures if f.rendezvous_at]
    if times:
        result.recovery_median_s, result.recovery_max_s = statistics.median(times), max(times)
    with open(probe_file) as f:
        probes = [json.loads(line) for line in f]
    result.second, result.last = probes[1], probes[-1]
    return result


def main(argv: list[str]) -> None:
    faults, storage_path, out = argv
    result = soak(int(faults), storage_path, f"{out}.probes")
    with open(out, "w") as f:
        json.dump({**asdict(result), "rss_growth": result.rss_growth}, f)


if __name__ == "__main__":
    main(sys.argv[1:])
