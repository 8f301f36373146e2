"""The chaos suite's faults on what storage holds: a power cut during a commit, and a
stray writer's commit marker.

``power_cut_commit``: the job runs under its own driver (:mod:`tests.support.power_cut_job`),
whose rank 0 records every step its checkpoint commits make in the run directory on a
model of a disk that keeps only what was fsynced (:class:`tests.support.power_cut.PowerCutDisk`),
and at the drawn step of the drawn commit writes what the model says a power cut leaves
(the file system's journal the drawn number of steps behind) and SIGKILLs the whole job.
The trial makes the run directory's checkpoints and upload markers exactly that, and
``TorchTrainer.restore(path)`` continues. The tree left must hold no commit marker over
damaged files and the newest checkpoint whose ``commit()`` had returned; the restore must
resume from the newest intact checkpoint in it.

``hostile_manifest``: a worker stalls at the trial's time; once the checkpoint before is
committed, a stray writer replaces its commit marker with hostile or corrupt content
(absolute paths, ``..`` paths, wrong sizes or CRC-32s, truncated JSON, JSON that is no
object), pointing the paths at a planted canary; then the stalled worker is SIGKILLed,
so the restart reads it. On local disk or S3 (then the restart's check goes through the
node's local tier: its kept copy, a download). The canary must be untouched (nothing
written outside the run directory and the local tier), the restart must resume from the
checkpoint before the hostile one.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import zlib
from types import SimpleNamespace

import elastic_train as et
from elastic_train.errors import CorruptManifestError
from elastic_train.storage.checkpoint_names import dir_name
from elastic_train.storage.checkpoint_store import MARKER, parse_marker
from elastic_train.storage.run_state import RunStatus
from elastic_train.torch import TorchTrainer
from tests.chaos.faults import (
    EPOCHS,
    NUM_TO_KEEP,
    Outcome,
    StorageWatcher,
    Trial,
    _outcome,
)
from tests.conftest import StorageUnderTest, pid_alive, wait_until
from tests.support import jobs
from tests.support.paths import REPO
from tests.support.power_cut import materialize, tree_from_json
from tests.support.power_cut_job import STEPS_PER_COMMIT, modeled

HOSTILE = ("absolute", "dotdot", "wrong_size", "wrong_crc", "truncated", "non_object")
PLANTED = b"a stray writer's bytes\n"  # what a hostile path's file holds on the store
STORES = ("local", "s3")


def draw_detail(kind: str, rng: random.Random) -> dict:
    """What a trial of ``kind`` draws besides the common fields (``Trial.draw``)."""
    if kind == "power_cut_commit":  # the commit of checkpoint `epoch`, 1 to 3
        step = rng.randrange(STEPS_PER_COMMIT)
        return {"details": (("step", step), ("journal_lag", rng.randint(0, step + 1)))}
    # the marker of checkpoint epoch - 1 is replaced; epoch - 2 is there to fall back to
    return {"epoch": rng.randint(2, EPOCHS - 2),
            "details": (("hostile", rng.choice(HOSTILE)), ("store", rng.choice(STORES)),
                       ("variant", rng.randrange(1000)))}


def run_storage_trial(trial: Trial, storage: StorageUnderTest, tmp_path, name: str) -> Outcome:
    if trial.kind == "power_cut_commit":
        return _power_cut_trial(trial, storage, tmp_path, name)
    return _hostile_manifest_trial(trial, storage, tmp_path, name)


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
    materialize(tree, run_dir)


def _power_cut_trial(trial: Trial, storage: StorageUnderTest, tmp_path, name: str) -> Outcome:
    pid_dir, cut_file = tmp_path / "pids", tmp_path / "cut.json"
    pid_dir.mkdir()
    spec = {"index": trial.epoch, "step": trial.detail("step"),
            "journal_lag": trial.detail("journal_lag"), "out": str(cut_file),
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


# --- hostile_manifest -------------------------------------------------------------------

def plant_canary(tmp_path) -> SimpleNamespace:
    """A file a hostile path points at, and a name in its directory that must stay free."""
    directory = tmp_path / "canary"
    directory.mkdir()
    victim = directory / "victim"
    victim.write_bytes(b"canary: nothing may write here\n")
    return SimpleNamespace(dir=directory, victim=victim, fresh=directory / "planted",
                           content=victim.read_bytes(), mtime=victim.stat().st_mtime_ns)


def canary_problems(canary: SimpleNamespace) -> list[str]:
    problems = []
    if not canary.victim.exists() or canary.victim.read_bytes() != canary.content \
            or canary.victim.stat().st_mtime_ns != canary.mtime:
        problems.append(f"{canary.victim} (a hostile path's target) was written")
    if extra := sorted(set(os.listdir(canary.dir)) - {"victim"}):
        problems.append(f"files appeared beside the canary: {extra}")
    return problems


def hostile_marker(kind: str, raw: bytes, canary: SimpleNamespace, variant: int) -> bytes:
    """The committed marker ``raw`` made hostile (``kind`` of HOSTILE; ``variant`` picks
    among the ways of a kind)."""
    real = json.loads(raw)
    files = real["files"]
    target = {"size": len(PLANTED), "crc32": f"{zlib.crc32(PLANTED):08x}", "rank": 0}
    if kind == "absolute":
        files = {**files, str(canary.victim): target, str(canary.fresh): target}
    elif kind == "dotdot":  # resolves to the canary from any directory (up to 40 deep)
        up = "../" * 40
        files = {**files, up + str(canary.victim).lstrip("/"): target,
                 up + str(canary.fresh).lstrip("/"): target,
                 f"../{dir_name(real['index'] - 1)}/{sorted(files)[0]}": target}
    elif kind == "wrong_size":
        files = {rel: {**info, "size": info["size"] + (1 if variant % 2 else -1)}
                 for rel, info in files.items()}
    elif kind == "wrong_crc":
        files = {rel: {**info, "crc32": f"{int(info['crc32'], 16) ^ (1 << variant % 32):08x}"}
                 for rel, info in files.items()}
    elif kind == "truncated":
        return raw[:1 + variant % (len(raw) - 1)]
    else:
        return json.dumps([[real], None, "checkpoint", 7, []][variant % 5]).encode()
    return json.dumps({**real, "files": files}).encode()


def _plant(storage: StorageUnderTest, checkpoint: str, hostile: bytes) -> None:
    """On an object store, puts PLANTED (matching the hostile entries' size and CRC-32) at
    the key each hostile path names, so that a reader following those paths would find
    a file to download over the canary (local disk: the paths name the canary itself)."""
    if storage.url.startswith("/"):
        return
    files = json.loads(hostile)["files"]
    for rel in files:
        if rel.startswith("/") or ".." in rel.split("/"):
            with contextlib.suppress(Exception):  # a key the store refuses cannot be read
                storage.fs.pipe_file(f"{checkpoint}/{rel}", PLANTED)


def _stray_writer(trial: Trial, storage: StorageUnderTest, name: str, tmp_path,
                  watcher: StorageWatcher, canary: SimpleNamespace, found: dict) -> None:
    """Waits for the stalled worker and the commit before it, makes that commit's marker
    hostile, then SIGKILLs the stalled worker (always, so the job goes on)."""
    pid_file = tmp_path / "stalled.pid"
    pid = None

    def stalled() -> bool:  # the file is created, then written: wait for its number
        return pid_file.exists() and pid_file.read_text().strip().isdigit()

    try:
        assert wait_until(stalled, 120), "the worker did not stall"
        pid = int(pid_file.read_text())
        index = trial.epoch - 1
        run = f"{storage.url}/{name}"
        marker = f"{run}/{dir_name(index)}/{MARKER}"

        def committed() -> bool:
            storage.fs.invalidate_cache()
            return storage.fs.exists(marker)

        assert wait_until(committed, 60), f"{dir_name(index)} was not committed"
        before = parse_marker(storage.fs.cat_file(f"{run}/{dir_name(index - 1)}/{MARKER}"),
                              dir_name(index - 1))
        found["expected"] = before.training_iteration
        watcher.exempt(index)  # the stray writer's doing, not the product's
        hostile = hostile_marker(trial.detail("hostile"), storage.fs.cat_file(marker),
                                 canary, trial.detail("variant"))
        if trial.detail("hostile") in ("absolute", "dotdot"):
            _plant(storage, f"{run}/{dir_name(index)}", hostile)
        storage.fs.pipe_file(marker, hostile)
        found["hostile"] = hostile[:300]
    except BaseException as exc:  # reported by the trial
        found["error"] = repr(exc)
    finally:
        (tmp_path / "fault").write_text(str(time.time()))
        if pid is not None:
            os.kill(pid, signal.SIGKILL)


def _hostile_manifest_trial(trial: Trial, storage: StorageUnderTest, tmp_path, name: str
                            ) -> Outcome:
    canary = plant_canary(tmp_path)
    config = {"epochs": EPOCHS, "events_file": str(tmp_path / "events"), "step_sleep": 0.05,
              "pids_file": str(tmp_path / "pids"),
              "fault": {"rank": trial.rank, "epoch": trial.epoch, "batch": trial.batch,
                        "how": "wait_for_kill", "marker": str(tmp_path / "stalled"),
                        "pid_file": str(tmp_path / "stalled.pid")}}
    run_storage = storage.run(name)
    found: dict = {}
    with StorageWatcher(run_storage) as watcher:
        writer = threading.Thread(target=_stray_writer, daemon=True, args=(
            trial, storage, name, tmp_path, watcher, canary, found))
        writer.start()
        result = TorchTrainer(
            jobs.train_mlp, train_loop_config=config,
            scaling_config=et.ScalingConfig(num_workers=2),
            run_config=storage.run_config(
                name, failure_config=et.FailureConfig(max_failures=1),
                checkpoint_config=et.CheckpointConfig(num_to_keep=NUM_TO_KEEP)),
            datasets={"train": jobs.make_dataset()},
        ).fit()
        writer.join(30)
    assert "error" not in found, f"the stray writer failed: {found['error']}"
    outcome = _outcome(result.return_value["digest"], run_storage, watcher, tmp_path)
    outcome.kind_failures += canary_problems(canary)
    outcome.orphans = [int(line.split()[1]) for line in
                       (tmp_path / "pids").read_text().splitlines()]
    fault_at = float((tmp_path / "fault").read_text())
    restores = [r for r in run_storage.read_restores() if r.time >= fault_at]
    resumed = restores[0].restored_iteration if restores else None
    if resumed != found["expected"]:
        outcome.kind_failures.append(
            f"the restart resumed from iteration {resumed}, not {found['expected']} (the "
            f"checkpoint before the hostile {dir_name(trial.epoch - 1)})")
    outcome.note = (f"{trial.detail('hostile')} marker on {trial.detail('store')}: "
                    f"{found['hostile']!r}; resumed from iteration {resumed}")
    return outcome
