"""The chaos suite's faults on what storage holds: a power cut during a commit.

``power_cut_commit``: the job runs under its own driver (:mod:`tests.support.power_cut_job`),
whose rank 0 records every step its checkpoint commits make in the run directory on a
model of a disk that keeps only what was fsynced (:class:`tests.support.power_cut.PowerCutDisk`),
and at the drawn step of the drawn commit writes what the model says a power cut leaves
(the file system's journal the drawn number of steps behind) and SIGKILLs the whole job.
The trial makes the run directory's checkpoints and upload markers exactly that, and
``TorchTrainer.restore(path)`` continues. The tree left must hold no commit marker over
damaged files and the newest checkpoint whose ``commit()`` had returned; the restore must
resume from the newest intact checkpoint in it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import zlib
from types import SimpleNamespace

from elastic_train.errors import CorruptManifestError
from elastic_train.storage.checkpoint_store import MARKER, dir_name, parse_marker
from elastic_train.storage.run_state import RunStatus
from elastic_train.torch import TorchTrainer
from tests.chaos.faults import (
    Outcome,
    StorageWatcher,
    Trial,
    _outcome,
)
from tests.conftest import StorageUnderTest, pid_alive, wait_until
from tests.support.paths import REPO
from tests.support.power_cut import tree_from_json
from tests.support.power_cut_job import STEPS_PER_COMMIT, modeled


def draw_detail(kind: str, rng: random.Random) -> dict:
    """What a trial of ``kind`` draws besides the common fields (``Trial.draw``)."""
    # power_cut_commit: the commit of checkpoint `epoch`, 1 to 3
    step = rng.randrange(STEPS_PER_COMMIT)
    return {"detail": (("step", step), ("journal_lag", rng.randint(0, step + 1)))}


def run_storage_trial(trial: Trial, storage: StorageUnderTest, tmp_path, name: str) -> Outcome:
    return _power_cut_trial(trial, storage, tmp_path, name)


# --- power_cut_commit -------------------------------------------------------------------

def judge_tree(tree: dict[str, bytes | None], committed: int | None
               ) -> tuple[int | None, list[str], list[str]]:
    """What a power cut left of the checkpoints (``tree``, relative to the run directory):
    the newest checkpoint with a commit marker over intact files (None: none), the
    markers over damaged files (or that are no manifest), and the checkpoint whose
    ``commit()`` had returned (``committed``) if the cut lost it."""
    intact, torn = [], []
    for top in sorted(rel for rel, data in tree.items() if data is None and "/" not in rel):
        marker = tree.get(f"{top}/{MARKER}")
        if not top.startswith("checkpoint_") or marker is None:
            continue
        try:
            manifest = parse_marker(marker, top)
        except CorruptManifestError as exc:
            torn.append(f"{top}: {exc}")
            continue
        bad = [rel for rel, info in manifest.files.items()
               if (data := tree.get(f"{top}/{rel}")) is None or len(data) != info["size"]
               or f"{zlib.crc32(data):08x}" != info["crc32"]]
        if bad:
            torn.append(f"{top} committed over damaged files {bad}")
        else:
            intact.append(manifest.index)
    newest = max(intact, default=None)
    lost = [] if committed is None or (newest is not None and newest >= committed) else \
        [f"{dir_name(committed)} had been committed before the power cut; it left "
         f"{dir_name(newest) if newest is not None else 'no checkpoint'}"]
    return newest, torn, lost


def power_off(run_dir: str, tree: dict[str, bytes | None]) -> None:
    """Makes the modeled part of ``run_dir`` (checkpoints, upload markers) exactly what
    ``tree`` holds of it; the rest stays as the kill left it."""
    for name in os.listdir(run_dir):
        if modeled(name):
            path = os.path.join(run_dir, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    for rel, data in sorted(tree.items()):  # a directory before what is in it
        path = os.path.join(run_dir, rel)
        if data is None:
            os.makedirs(path, exist_ok=True)
        else:
            with open(path, "wb") as f:
                f.write(data)


def _power_cut_trial(trial: Trial, storage: StorageUnderTest, tmp_path, name: str) -> Outcome:
    pid_dir, cut_file = tmp_path / "pids", tmp_path / "cut.json"
    pid_dir.mkdir()
    spec = {"index": trial.epoch, "step": trial.detail_of("step"),
            "journal_lag": trial.detail_of("journal_lag"), "out": str(cut_file),
            "graveyard": str(tmp_path / "inodes")}
    run_storage = storage.run(name)
    with StorageWatcher(run_storage) as first, open(tmp_path / "driver.log", "w") as log:
        driver = subprocess.Popen(
            [sys.executable, "-m", "tests.support.power_cut_job", storage.url, name,
             str(pid_dir), json.dumps(spec)],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            driver.wait(150)
        finally:
            if driver.poll() is None:
                os.killpg(driver.pid, signal.SIGKILL)
                driver.wait()
    said = (tmp_path / "driver.log").read_text()[-3000:]
    assert cut_file.exists(), f"no power cut (the driver exited {driver.returncode}): {said}"
    workers = [int(p.name.split("-")[1]) for p in pid_dir.glob("worker-*")]
    assert wait_until(lambda: not [p for p in workers if pid_alive(p)], 10), \
        "a worker outlived the power cut"
    cut = json.loads(cut_file.read_text())
    tree = tree_from_json(cut["tree"])
    durable, torn, lost = judge_tree(tree, cut["committed"])
    assert run_storage.read_run_state().status is RunStatus.RUNNING
    power_off(run_storage.run_path, tree)
    (tmp_path / "fault").write_text(str(cut["time"]))
    with StorageWatcher(run_storage) as second:
        result = TorchTrainer.restore(f"{storage.url}/{name}",
                                      storage_options=storage.options).fit()
    seen = SimpleNamespace(partial=first.partial + second.partial, lost=first.lost + second.lost)
    outcome = _outcome(result.return_value["digest"], run_storage, seen, tmp_path,
                       events=pid_dir / "events")
    outcome.partial_seen += torn
    outcome.lost_commits += lost
    outcome.orphans = [int(p.name.split("-")[1]) for p in pid_dir.glob("worker-*")]
    expected = 0 if durable is None else parse_marker(
        tree[f"{dir_name(durable)}/{MARKER}"], dir_name(durable)).training_iteration
    restores = [r for r in run_storage.read_restores() if r.time >= cut["time"]]
    resumed = restores[0].restored_iteration if restores else None
    outcome.note = (f"cut at step {cut['cut'] - cut['start']} of {dir_name(trial.epoch)}'s "
                    f"commit ({cut['ops'][-1]}), journal at {cut['journal_op']}; durable: "
                    f"{dir_name(durable) if durable is not None else 'none'}, "
                    f"resumed from iteration {resumed}")
    if resumed != expected:
        outcome.kind_failures.append(f"the restore resumed from iteration {resumed}, not "
                                     f"{expected} (the newest intact checkpoint the cut left)")
    return outcome
