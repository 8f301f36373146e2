"""The chaos suite's ``power_cut_commit`` job: the deterministic job (:func:`jobs.train_mlp`)
whose rank 0 records, on a :class:`~tests.support.power_cut.PowerCutDisk`, every step its
checkpoint commits make in the run directory, and cuts the power at a drawn step of one
commit: it writes what the disk model says survives the cut (``after_cut``) to a file,
then SIGKILLs the driver and every process below it, itself last, so that nothing of
the job writes another byte.

Only rank 0 writes the checkpoints' files, upload markers and commit markers of this
job (rank 1 reports no files), so the model of that one process covers every step of a
commit. What it models is the part of the run directory the commits write
(:func:`modeled`: ``checkpoint_*/`` and ``.upload-marks/``); the driver's files
(``run.json``, ``metrics.jsonl``, ``restores.json``, ``trainable.pkl``, logs) are
left as the kill left them.

Usage (the trial's driver, started in a session of its own)::

    python -m tests.support.power_cut_job STORAGE NAME PID_DIR CUT_JSON

``CUT_JSON``: ``{"index": checkpoint whose commit is cut, "step": its step (0 = the
first step that names the checkpoint's directory), "journal_lag": how many steps the
file system's journal is behind the cut, "out": where the surviving tree goes,
"graveyard": the model's side directory (same file system as STORAGE)}``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import time

import cloudpickle

import elastic_train as et
from elastic_train.storage.checkpoint_names import dir_name
from elastic_train.storage.checkpoint_store import CheckpointStore
from elastic_train.torch import TorchTrainer
from tests.support import jobs, power_cut, process_tree
from tests.support.power_cut import PowerCutDisk, tree_to_json

# The steps of a commit that retires a checkpoint (num_to_keep=2), on local disk:
# mkdir, link, fsync the file, fsync its directory, fsync the run directory; the upload
# marker (mkdir .upload-marks, fsync the temporary file, replace, fsync the directory);
# the commit marker (the same four); remove the upload marker; retention's delete
# (remove the old marker, fsync its directory, unlink its file, rmdir). A commit that
# retires none has the first 14 (tests/unit/test_checkpoint_durability.py counts them).
STEPS_PER_COMMIT = 18
NUM_TO_KEEP = 2
_MODELED = re.compile(r"^(checkpoint_\d{6,}|\.upload-marks)$")


def modeled(rel: str) -> bool:
    """Whether the run directory's path ``rel`` is in the part the commits write."""
    return bool(_MODELED.match(rel.split("/", 1)[0]))


def kill_job(driver_pid: int) -> None:
    """SIGKILLs the driver and every process below it, this one last (a power cut)."""
    me = os.getpid()
    for pid in [driver_pid, *process_tree.descendants(driver_pid)]:
        if pid != me:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    os.kill(me, signal.SIGKILL)


class CommitCut:
    """``on_step`` of the disk: at step ``spec["step"]`` of checkpoint ``spec["index"]``'s
    commit, writes the surviving tree to ``spec["out"]`` and kills the job."""

    def __init__(self, disk: PowerCutDisk, spec: dict, driver_pid: int):
        self.disk = disk
        self.spec = spec
        self.driver_pid = driver_pid
        self.start: int | None = None
        self.committed: list[int] = []  # checkpoints whose commit() had returned

    def _names_checkpoint(self, step: int) -> bool:
        paths = self.disk.ops[step].split(" ", 1)[1].split(" -> ")
        return any(p.split("/", 1)[0] == dir_name(self.spec["index"]) for p in paths)

    def __call__(self, step: int) -> None:
        if self.start is None and self._names_checkpoint(step):
            self.start = step
        if self.start is None or step - self.start != self.spec["step"]:
            return
        journal = max(step - self.spec["journal_lag"], 0)
        tree = {rel: data for rel, data in self.disk.after_cut(step, journal).items()
                if modeled(rel)}
        record = {"time": time.time(), "cut": step, "journal": journal, "start": self.start,
                  "ops": self.disk.ops[self.start:step + 1], "journal_op": self.disk.ops[journal],
                  "committed": max(self.committed, default=None), "tree": tree_to_json(tree)}
        out = self.spec["out"]
        with open(out + ".tmp", "w") as f:
            json.dump(record, f)
        os.rename(out + ".tmp", out)  # outside the run directory: no step
        kill_job(self.driver_pid)


@contextlib.contextmanager
def cut_power(run_dir: str, spec: dict, driver_pid: int):
    """Records the block's steps in ``run_dir`` and cuts the power as ``spec`` says."""
    disk = PowerCutDisk(run_dir, spec["graveyard"])
    cut = CommitCut(disk, spec, driver_pid)
    commit = CheckpointStore.commit

    def noting(store: CheckpointStore, manifest) -> None:
        commit(store, manifest)
        cut.committed.append(manifest.index)

    CheckpointStore.commit = noting
    try:
        with disk.recording(on_step=cut):
            yield
    finally:
        CheckpointStore.commit = commit


def train(config: dict) -> dict:
    """:func:`jobs.train_mlp`, rank 0 under a power cut until one happened (a restore runs
    this again, with the same config, after the cut)."""
    with open(os.path.join(config["pid_dir"], f"worker-{os.getpid()}"), "w") as f:
        f.write(str(os.getpid()))
    spec = config["power_cut"]
    if et.get_context().get_world_rank() != 0 or os.path.exists(spec["out"]):
        return jobs.train_mlp(config)
    with cut_power(config["run_dir"], spec, config["driver_pid"]):
        return jobs.train_mlp(config)


def main(argv: list[str]) -> None:
    storage, name, pid_dir, spec = argv
    for module in (jobs, power_cut, process_tree):
        cloudpickle.register_pickle_by_value(module)
    result = TorchTrainer(
        train,
        train_loop_config={"epochs": 5, "pid_dir": pid_dir, "step_sleep": 0.05,
                           "events_file": os.path.join(pid_dir, "events"),
                           "power_cut": json.loads(spec), "driver_pid": os.getpid(),
                           "run_dir": os.path.join(storage, name)},
        scaling_config=et.ScalingConfig(num_workers=2),
        run_config=et.RunConfig(
            storage_path=storage, name=name,
            failure_config=et.FailureConfig(max_failures=0),
            checkpoint_config=et.CheckpointConfig(num_to_keep=NUM_TO_KEEP)),
        datasets={"train": jobs.make_dataset()},
    ).fit()
    print("DIGEST", result.return_value["digest"], flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
