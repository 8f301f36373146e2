"""The chaos suite's faults: each kind sets up one trial of the deterministic job.

A :class:`Trial` says what to inject where; :func:`run_trial` runs the job
with it, watches the storage while it runs, and returns an :class:`Outcome`
with the checks the suite asserts and tabulates.
"""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace

import elastic_train as et
from elastic_train.storage import RunStorage
from elastic_train.storage.checkpoint_store import MARKER
from elastic_train.storage.run_state import RunStatus
from elastic_train.torch import TorchTrainer
from tests.conftest import EPOCHS, StorageUnderTest, wait_until
from tests.support import jobs
from tests.support.etcd_server import EtcdServer, etcd_binary
from tests.support.paths import REPO
from tests.support.process_tree import signal_tree, stop_logged
from tests.support.rendezvous_state import corrupt_c10d_state, corrupt_etcd_round, delete_run_keys
from tests.support.servers import TcpProxy, free_port

KINDS = ("worker_sigkill", "worker_raise", "worker_hang", "kill_during_upload",
         "kill_during_background_write",
         "preemption", "storage_outage", "driver_sigkill_restore", "agent_sigkill",
         "etcd_restart", "node_sigterm", "corrupt_rdzv_state", "clock_skew",
         "sigterm_then_restart",
         "second_driver", "stale_lookups",  # these two: writer_faults.py
         "power_cut_commit", "hostile_manifest",  # these two: storage_faults.py
         "replica_lost", "hostile_peer",  # these two: replica_faults.py
         "health_check_fails", "node_fails_twice", "straggler",  # these: node_faults.py
         "node_lost_with_spare",
         "etcd_silent", "etcd_compacted_restart")  # these two: etcd_faults.py
STORAGE_KINDS = ("power_cut_commit", "hostile_manifest")
# node_faults.py's (its NODE_KINDS): three agents at most, drawn by the long and all
# profiles only, so that CI's short profile costs what it did.
NODE_KINDS = ("health_check_fails", "node_fails_twice", "straggler", "node_lost_with_spare")
# etcd_faults.py's: three agents at most, their etcd out of reach; long and all only too.
ETCD_WATCH_KINDS = ("etcd_silent", "etcd_compacted_restart")
LONG_ONLY_KINDS = (*NODE_KINDS, *ETCD_WATCH_KINDS)
LAUNCH_KINDS = ("agent_sigkill", "etcd_restart", "node_sigterm", "corrupt_rdzv_state",
                "clock_skew", *NODE_KINDS, *ETCD_WATCH_KINDS)
LAUNCH_SCRIPT = "tests/e2e/scripts/launch_script.py"  # its digest does not depend on the world size
BATCHES_PER_EPOCH = 6  # jobs.make_dataset(): 96 rows, 2 ranks, batches of 8
NUM_TO_KEEP = 2
SKEW_RANGE_S = (0.05, 30.0)  # clock_skew: how far one node's clock is off, either way
SKEWED_CLOCK = os.path.join(REPO, "tests", "support", "skewed_clock")  # its sitecustomize
NOTICE_GRACE_S = 0.2  # sigterm_then_restart: over before the raise 6 steps (0.3 s) later


@dataclass(frozen=True)
class Trial:
    """One fault of ``kind`` at ``(epoch, batch)`` on ``rank``; ``details``: what else a
    kind draws, as ``(name, value)`` pairs (:func:`_draw_details`; the storage kinds'
    in :func:`.storage_faults.draw_detail`).

    ``clock_skew``: ``rank`` is the node (agent) whose worker raises; ``skewed_node`` the
    node whose clock is ``skew_s`` off; ``in_process``: the script restarts in process
    (``--restartable``), else in new processes. ``sigterm_then_restart``: ``rank`` gets the
    SIGTERM; ``raise_rank`` raises afterwards, ``again_rank`` once more after the restart,
    at batch ``again_batch`` of the next epoch."""

    number: int
    kind: str
    epoch: int
    batch: int
    rank: int
    details: tuple[tuple[str, float | int | str], ...] = ()

    @classmethod
    def draw(cls, number: int, kind: str, rng: random.Random) -> Trial:
        trial = cls(number, kind, rng.randint(1, EPOCHS - 2),
                    rng.randrange(BATCHES_PER_EPOCH), rng.randrange(2))
        if kind in STORAGE_KINDS:
            from tests.chaos.storage_faults import draw_detail  # it builds on this module

            return replace(trial, **draw_detail(kind, rng))
        return replace(trial, details=_draw_details(kind, rng))

    def detail(self, name: str) -> float | int | str | None:
        return dict(self.details).get(name)

    def __str__(self) -> str:
        if self.kind == "power_cut_commit":
            return f"#{self.number} {self.kind} of checkpoint {self.epoch} at step " \
                   f"{self.detail('step')}, journal {self.detail('journal_lag')} behind"
        said = f"#{self.number} {self.kind} at epoch {self.epoch} batch {self.batch}, " \
               f"rank {self.rank}"
        if self.details:
            said += " (" + ", ".join(f"{name} {value:g}" if isinstance(value, float)
                                     else f"{name} {value}"
                                     for name, value in self.details) + ")"
        return said


def _draw_details(kind: str, rng: random.Random) -> tuple[tuple[str, float], ...]:
    """What a kind draws besides where and when (other kinds: nothing)."""
    if kind == "clock_skew":  # which node's clock is off, and by how much (log-uniform)
        low, high = (math.log10(s) for s in SKEW_RANGE_S)
        skew = round(10 ** rng.uniform(low, high), 3) * rng.choice((-1, 1))
        return (("skewed_node", rng.randrange(2)), ("skew_s", skew),
                ("in_process", rng.randrange(2)))  # the script restarts in process
    if kind == "sigterm_then_restart":
        return (("raise_rank", rng.randrange(2)), ("again_rank", rng.randrange(2)),
                ("again_batch", rng.randrange(BATCHES_PER_EPOCH)))
    if kind == "etcd_silent":  # how long etcd's flows are held
        from tests.chaos.etcd_faults import STALL_RANGE_S

        return (("stall_s", round(rng.uniform(*STALL_RANGE_S), 2)),)
    if kind == "replica_lost":  # peer replicas: a remote store and two nodes
        return (("store", "s3"),)
    if kind == "hostile_peer":  # and how long the attack lasts
        return (("store", "s3"), ("hostile_s", round(rng.uniform(3.0, 8.0), 1)))
    return ()


@dataclass
class Outcome:
    """What one trial showed."""

    digest: str | None = None
    recovery_s: float | None = None
    partial_seen: list[str] = field(default_factory=list)
    retained: list[int] = field(default_factory=list)
    iterations: list[int] = field(default_factory=list)
    latest: int | None = None  # the index of the last checkpoint reported
    num_to_keep: int | None = NUM_TO_KEEP
    orphans: list[int] = field(default_factory=list)  # worker pids that must be gone
    lost_commits: list[str] = field(default_factory=list)  # committed, then gone unretired
    second_refused: bool | None = None  # second_driver: refused before starting anything
    kind_failures: list[str] = field(default_factory=list)  # the kind's own checks that failed
    note: str = ""  # what the trial hit, for its row (e.g. which step of a commit)


class StorageWatcher:
    """Polls the run's committed checkpoints while the job runs, and records any
    whose files do not all exist at their manifest's sizes (a partial checkpoint).
    A checkpoint being deleted by retention (its marker already gone) is not partial.
    It also records when the newest committed checkpoint vanishes (``lost``):
    retention never deletes the latest, so only a wrongful cleanup does that.
    Checkpoints the test itself damages are left out (:meth:`exempt`)."""

    def __init__(self, storage: RunStorage):
        self.storage = storage
        self.partial: list[str] = []
        self.lost: list[str] = []
        self._newest = -1
        self._checked: set[int] = set()
        self._exempt: set[int] = set()
        self._seen: set[int] = set()  # every index seen committed (and not exempt)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> StorageWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        self._check()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                self._check()
            except Exception:  # the storage may be cut on purpose; try again
                continue

    def exempt(self, index: int) -> None:
        """Leaves checkpoint ``index`` out from now on (a stray writer damages it)."""
        with self._lock:
            self._exempt.add(index)
            self._seen.discard(index)
            self._newest = max(self._seen, default=-1)

    def _check(self) -> None:
        with self._lock:
            self._check_locked()

    def _check_locked(self) -> None:
        fs = self.storage.fs
        fs.invalidate_cache()
        committed = [m for m in self.storage.checkpoints.committed()
                     if m.index not in self._exempt]
        newest = max((m.index for m in committed), default=-1)
        if newest < self._newest:
            self.lost.append(f"checkpoint {self._newest} (newest committed) vanished")
        self._newest = max(newest, self._newest)
        self._seen.update(m.index for m in committed)
        for manifest in committed:
            if manifest.index in self._checked:
                continue
            path = self.storage.checkpoints.path(manifest.index)
            for rel, info in manifest.files.items():
                try:
                    ok = fs.size(f"{path}/{rel}") == info["size"]
                except FileNotFoundError:
                    ok = not fs.exists(f"{path}/{MARKER}")  # deleted meanwhile
                if not ok:
                    self.partial.append(f"{path}/{rel}")
            self._checked.add(manifest.index)


def _fault_config(trial: Trial, tmp_path) -> dict:
    how = {"worker_sigkill": "sigkill", "worker_raise": "raise", "worker_hang": "deadlock",
           "kill_during_upload": "sigkill", "kill_during_background_write": "sigkill",
           "preemption": "preempt"}[trial.kind]
    right_after_a_report = trial.kind in ("kill_during_upload", "kill_during_background_write")
    batch = 0 if right_after_a_report else trial.batch
    return {"rank": trial.rank, "epoch": trial.epoch, "batch": batch, "how": how,
            "marker": str(tmp_path / "fault"), "pid_file": str(tmp_path / "preempted.pid")}


def _reclaim_after_jit(tmp_path) -> None:
    """The scheduler's kill, once the job saved its just-in-time checkpoint."""
    pid_file, jit = tmp_path / "preempted.pid", tmp_path / "jit"
    if wait_until(lambda: jit.exists() and pid_file.exists(), 120):
        os.kill(int(pid_file.read_text()), signal.SIGKILL)


def _at_fault_time(trial: Trial, storage: StorageUnderTest, name: str, tmp_path,
                   world_size: int | None = None) -> bool:
    """Waits until checkpoint ``trial.epoch - 1`` is committed, then ``trial.batch`` tenths
    of a second more, and stamps the fault's time; False if no commit came in time.
    With ``world_size``, until a checkpoint from ``trial.epoch - 1`` on is committed by a
    job of that many workers (launch trials: a node that missed the first round joins
    the job later, and a fault before that would hit a node outside it)."""
    marker = f"{storage.url}/{name}/checkpoint_{trial.epoch - 1:06d}/{MARKER}"
    run = storage.run(name)

    def committed() -> bool:
        storage.fs.invalidate_cache()
        if world_size is None:
            return storage.fs.exists(marker)
        return any(m.index >= trial.epoch - 1 and m.world_size == world_size
                   for m in run.checkpoints.committed())

    if not wait_until(committed, 120, interval=0.1):
        return False
    time.sleep(0.1 * trial.batch)
    (tmp_path / "fault").write_text(str(time.time()))
    return True


def _cut_for_seconds(proxy: TcpProxy, storage: StorageUnderTest, name: str, trial: Trial,
                     tmp_path) -> None:
    """Cuts the S3 endpoint for 3 s at the trial's fault time."""
    if _at_fault_time(trial, storage, name, tmp_path):
        proxy.cut()
        time.sleep(3)
        proxy.restore()


def _recovery_s(fault, events) -> float | None:
    """Fault time (the fault marker's time) to rank 0's first step after it."""
    if not fault.exists() or not events.exists():
        return None
    at = os.path.getmtime(fault) if fault.read_text() == "" else float(fault.read_text())
    after = [float(line.split()[1]) for line in events.read_text().split("\n")
             if line.startswith("first_step") and float(line.split()[1]) > at]
    return after[0] - at if after else None


def run_trial(trial: Trial, storage: StorageUnderTest, tmp_path, through: StorageUnderTest |
              None = None, proxy: TcpProxy | None = None) -> Outcome:
    """Runs the job with the trial's fault; ``through``/``proxy`` for storage outages."""
    name = f"chaos-{trial.number}-{trial.kind}"
    config = {"epochs": EPOCHS, "events_file": str(tmp_path / "events"), "step_sleep": 0.05,
              "jit_file": str(tmp_path / "jit")}
    failure = et.FailureConfig(max_failures=1)
    helper = None
    if trial.kind == "driver_sigkill_restore":
        return _driver_kill_trial(trial, storage, tmp_path, name)
    if trial.kind in NODE_KINDS:
        from tests.chaos.node_faults import run_node_trial  # it builds on this module

        return run_node_trial(trial, storage, tmp_path, name)
    if trial.kind in ETCD_WATCH_KINDS:
        from tests.chaos.etcd_faults import run_etcd_trial  # it builds on this module

        return run_etcd_trial(trial, storage, tmp_path, name)
    if trial.kind in LAUNCH_KINDS:
        return _launch_trial(trial, storage, tmp_path, name)
    if trial.kind in ("second_driver", "stale_lookups"):
        from tests.chaos.writer_faults import run_writer_trial  # it builds on this module

        return run_writer_trial(trial, storage, tmp_path, name)
    if trial.kind in STORAGE_KINDS:
        from tests.chaos.storage_faults import run_storage_trial  # it builds on this module

        return run_storage_trial(trial, storage, tmp_path, name)
    if trial.kind in ("replica_lost", "hostile_peer"):
        from tests.chaos.replica_faults import run_replica_trial  # it builds on this module

        return run_replica_trial(trial, storage, tmp_path, name)
    if trial.kind == "storage_outage":
        helper = threading.Thread(target=_cut_for_seconds, daemon=True,
                                  args=(proxy, storage, name, trial, tmp_path))
        failure = et.FailureConfig(max_failures=0)
    elif trial.kind != "sigterm_then_restart":  # (its faults: below)
        config["fault"] = _fault_config(trial, tmp_path)
    if trial.kind == "worker_hang":
        failure = et.FailureConfig(max_failures=1, hang_timeout_s=4)
    if trial.kind == "kill_during_upload":
        config.update(ballast_mb=8, upload_mode="ASYNC")
    if trial.kind == "kill_during_background_write":  # async_save's writer process still writes
        config.update(process_save=True, state_ballast_mb=64)
    if trial.kind == "preemption":
        config["watch_preemption"] = True
        failure = et.FailureConfig(max_failures=0)
        helper = threading.Thread(target=_reclaim_after_jit, args=(tmp_path,), daemon=True)
    if trial.kind == "sigterm_then_restart":  # one restart of each budget
        config.update(faults=_notice_then_raises(trial, tmp_path),
                      report_log=str(tmp_path / "reports"))
        failure = et.FailureConfig(max_failures=1, max_preemption_failures=1,
                                   preemption_grace_s=NOTICE_GRACE_S)
    run_storage = storage.run(name)
    with StorageWatcher(run_storage) as watcher:
        if helper is not None:
            helper.start()
        try:
            result = TorchTrainer(
                jobs.train_mlp, train_loop_config=config,
                scaling_config=et.ScalingConfig(num_workers=2),
                run_config=(through or storage).run_config(
                    name, failure_config=failure,
                    checkpoint_config=et.CheckpointConfig(num_to_keep=NUM_TO_KEEP)),
                datasets={"train": jobs.make_dataset()},
            ).fit()
        except et.TrainingFailedError as exc:
            if trial.kind == "sigterm_then_restart":  # which budget ran out, and why
                state = run_storage.read_run_state()
                exc.add_note(f"failures charged as {[f.kind.value for f in state.failures]}")
            raise
    if trial.kind == "sigterm_then_restart":
        _check_notice_forgotten(trial, run_storage, tmp_path)
    return _outcome(result.return_value["digest"], run_storage, watcher, tmp_path)


def _notice_then_raises(trial: Trial, tmp_path) -> list[dict]:
    """sigterm_then_restart's faults: rank ``trial.rank`` gets SIGTERM (the notice) at
    (epoch - 1, batch) and is not killed; rank ``raise_rank`` raises one epoch later (the
    grace long over: an in-process restart), and ``again_rank`` once more after the
    restart, at batch ``again_batch`` of the epoch after (after a report)."""
    return [
        {"rank": trial.rank, "epoch": trial.epoch - 1, "batch": trial.batch, "how": "preempt",
         "marker": str(tmp_path / "notice"), "pid_file": str(tmp_path / "noticed.pid")},
        {"rank": int(trial.detail("raise_rank")), "epoch": trial.epoch, "batch": trial.batch,
         "how": "raise", "marker": str(tmp_path / "fault")},
        {"rank": int(trial.detail("again_rank")), "epoch": trial.epoch + 1,
         "batch": int(trial.detail("again_batch")), "how": "raise",
         "marker": str(tmp_path / "again")},
    ]


def _check_notice_forgotten(trial: Trial, run_storage: RunStorage, tmp_path) -> None:
    """The notice was real (the ranks agreed on it and made the reports SYNC) and its grace
    was over when the worker raised; after the in-process restart it is forgotten: no
    report is SYNC or sees a notice, and the next failure spends ``max_failures``."""
    noticed_at = os.path.getmtime(tmp_path / "noticed.pid")  # written just before SIGTERM
    rows = [line.split() for line in (tmp_path / "reports").read_text().splitlines()]
    # ATTEMPT EPOCH SYNCED NOTICE per epoch's report (jobs._log_report)
    assert ["0", str(trial.epoch - 1), "1", "1"] in rows, \
        f"the notice did not make epoch {trial.epoch - 1}'s report SYNC: {rows}"
    stale = [row for row in rows if row[0] != "0" and row[2:] != ["0", "0"]]
    assert not stale, f"after the restart, reports still SYNC or noticed: {stale}"
    assert {row[0] for row in rows} >= {"1", "2"}, f"not two restarts in process: {rows}"
    failures = run_storage.read_run_state().failures
    kinds = [f.kind.value for f in failures]
    # The first restart is the preemption budget's: the group knew of the notice (marks in
    # the agent's notice directory) in the attempt that failed.
    assert kinds == ["preemption", "failure"], f"failures charged as {kinds}"
    assert [f.root.rank for f in failures] == [trial.detail("raise_rank"),
                                               trial.detail("again_rank")], failures
    assert all(f.restart == "in-process" for f in failures), [f.restart for f in failures]
    late = failures[0].failed_at - noticed_at
    assert late > NOTICE_GRACE_S, f"the worker raised {late:.2f} s after the notice, " \
                                  f"within its {NOTICE_GRACE_S} s grace"


def _outcome(digest: str, run_storage: RunStorage, watcher: StorageWatcher,
             tmp_path, events=None, num_to_keep: int | None = NUM_TO_KEEP) -> Outcome:
    rows = run_storage.read_metrics()
    reported = [r["checkpoint_dir_name"] for r in rows if r.get("checkpoint_dir_name")]
    return Outcome(digest=digest, recovery_s=_recovery_s(tmp_path / "fault",
                                                         events or tmp_path / "events"),
                   partial_seen=watcher.partial, lost_commits=watcher.lost,
                   retained=[m.index for m in run_storage.checkpoints.committed()],
                   iterations=[int(r["training_iteration"]) for r in rows],
                   latest=int(reported[-1].rsplit("_", 1)[1]) if reported else None,
                   num_to_keep=num_to_keep)


def _driver_kill_trial(trial: Trial, storage: StorageUnderTest, tmp_path, name: str
                       ) -> Outcome:
    """SIGKILLs the driver and its whole process tree once checkpoint ``epoch - 1`` is
    committed, then continues the run with TorchTrainer.restore(path)."""
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    run_storage = storage.run(name)
    with StorageWatcher(run_storage) as watcher:
        driver = subprocess.Popen(
            [sys.executable, "-m", "tests.e2e.scripts.driver", storage.url, name, str(pid_dir),
             str(EPOCHS), "0.05"], cwd=REPO, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            assert _at_fault_time(trial, storage, name, tmp_path), "no checkpoint to resume from"
            os.killpg(driver.pid, signal.SIGKILL)  # the driver and every worker
        finally:
            if driver.poll() is None:
                os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
        state = run_storage.read_run_state()
        assert state.status is RunStatus.RUNNING  # nobody could record anything
        trainer = TorchTrainer.restore(f"{storage.url}/{name}", storage_options=storage.options)
        result = trainer.fit()
    return _outcome(result.return_value["digest"], run_storage, watcher, tmp_path,
                    events=pid_dir / "events", num_to_keep=None)  # scripts/driver.py keeps all


def launch_digest(out: str) -> str | None:
    """The final weights' digest an ``elastic-train launch`` of LAUNCH_SCRIPT printed."""
    found = [line.split()[-1] for line in out.splitlines() if "DIGEST " in line]
    return found[-1] if found else None


def _launch_trial(trial: Trial, storage: StorageUnderTest, tmp_path, name: str) -> Outcome:
    """Two agents (``launch --nnodes 1:2``) once checkpoint ``epoch - 1`` is committed:
    agent_sigkill SIGKILLs the one not hosting the c10d store (its worker dies with it;
    the survivor re-rendezvouses alone and finishes from the latest checkpoint);
    etcd_restart SIGKILLs their etcd server and starts it again on its data (the job
    rides through: etcd is needed at rendezvous and for the agents' heartbeats);
    node_sigterm sends SIGTERM to every process of that node at once (agent, zygote,
    stand-ins, workers: a scheduler stopping the node), whose workers then take part in
    checkpoints until its grace ends, and the survivor goes on alone, spending the
    preemption budget; corrupt_rdzv_state overwrites their rendezvous state (c10d's on
    rank 0 trials, etcd's round pointer on rank 1 trials, then SIGKILLs the second agent
    so that the first reads it), whereupon the nodes stop with an error naming the state
    and the fix, and ``elastic-train restore`` continues the run; clock_skew runs every
    process of one node with its clock off by the drawn skew (:data:`SKEWED_CLOCK`) and
    makes the worker of node ``trial.rank`` raise: the node whose worker raised is
    charged, both nodes restart and finish (:func:`_check_clock_skew`)."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    etcd = None
    endpoint = f"127.0.0.1:{free_port()}"
    sleep = "0.3"
    if trial.kind == "etcd_restart" or (trial.kind == "corrupt_rdzv_state" and trial.rank):
        etcd = EtcdServer(etcd_binary())
        etcd.start()
        endpoint = etcd.endpoint
    flags = ["--rdzv-backend", "c10d" if etcd is None else "etcd", "--rdzv-endpoint", endpoint]
    if trial.kind == "node_sigterm":  # epochs longer than the grace: the node goes mid-run
        flags, sleep = [*flags, "--preemption-grace", "2"], "1"
    script_flags = []
    if trial.kind == "clock_skew":
        script_flags = ["--crash-file", str(tmp_path / "crash")]
        if trial.detail("in_process"):
            script_flags.append("--restartable")
        (tmp_path / "clock").mkdir()
    run_storage = storage.run(name)
    agents = []
    node_pids: list[int] = []

    def agent(i: int) -> subprocess.Popen:
        log = open(tmp_path / f"agent{i}.log", "w")  # noqa: SIM115 (closed with the agent)
        proc = subprocess.Popen(
            [sys.executable, "-m", "elastic_train.cli", "launch", "--nnodes", "1:2",
             "--nproc-per-node", "1", *flags, *_node_flags(trial, i), "--rdzv-id", name,
             "--storage-path", storage.url, LAUNCH_SCRIPT, str(out_dir), str(EPOCHS + 3),
             "--sleep", sleep, "--slow-until-world", "2", *script_flags],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True,
            env=_node_env(trial, i, tmp_path))
        agents.append((proc, log))
        return proc

    with StorageWatcher(run_storage) as watcher:
        try:
            first = agent(0)
            time.sleep(2)  # agent 0 hosts the c10d store
            second = agent(1)
            assert _at_fault_time(trial, storage, name, tmp_path, world_size=2), \
                "no checkpoint of the two-node job"
            if trial.kind == "clock_skew":
                _write_atomically(tmp_path / "crash", str(trial.rank))  # that node's worker
            else:
                node_pids = _inject_launch_fault(trial.kind, second, etcd, tmp_path, endpoint,
                                                 name)
            if trial.kind == "corrupt_rdzv_state":
                _restore_after_corruption(agents, etcd, storage, name, tmp_path)
            else:
                assert first.wait(150) == 0, (tmp_path / "agent0.log").read_text()[-3000:]
            if trial.kind == "clock_skew":
                assert second.wait(150) == 0, (tmp_path / "agent1.log").read_text()[-3000:]
        finally:
            stop_logged(agents)
            if etcd is not None:
                etcd.stop()
    if trial.kind == "node_sigterm":
        kinds = [f.kind.value for f in run_storage.read_run_state().failures]
        assert kinds == ["preemption"], f"the survivor's restart was charged as {kinds}"
    if trial.kind == "clock_skew":
        _check_clock_skew(trial, run_storage, tmp_path, [proc.pid for proc, _ in agents])
    starts = out_dir / "starts"
    fault_at = float((tmp_path / "fault").read_text())
    # the last start, if it came after the fault (a second node joining late restarts too)
    restarted = os.path.getmtime(starts) > fault_at and os.path.getmtime(starts)
    final = tmp_path / ("restore.log" if trial.kind == "corrupt_rdzv_state" else "agent0.log")
    outcome = _outcome(launch_digest(final.read_text()), run_storage, watcher, tmp_path,
                       num_to_keep=None)
    outcome.recovery_s = restarted - fault_at if restarted else None
    outcome.orphans = [int(p.name.split("-")[1]) for p in out_dir.glob("pid-*")] + node_pids
    return outcome


def _launched_outcome(logs: str, run_storage: RunStorage, watcher: StorageWatcher, tmp_path,
                      out_dir) -> Outcome:
    """What a trial of launched agents showed: the digest their ``logs`` printed, the
    storage's checks, recovery (to the job's last start, if after the fault) and the
    workers that must be gone (``out_dir``: the launch script's)."""
    outcome = _outcome(launch_digest(logs), run_storage, watcher, tmp_path, num_to_keep=None)
    fault_at = float((tmp_path / "fault").read_text())
    starts = out_dir / "starts"
    restarted = os.path.getmtime(starts) > fault_at and os.path.getmtime(starts)
    outcome.recovery_s = restarted - fault_at if restarted else None
    outcome.orphans = [int(p.name.split("-")[1]) for p in out_dir.glob("pid-*")]
    return outcome


def _node_flags(trial: Trial, node: int) -> list[str]:
    """clock_skew: the raising node has one restart, the other none -- the job finishes
    only if each node charges the failure to the node whose worker raised."""
    if trial.kind == "clock_skew":
        return ["--max-restarts", "1" if node == trial.rank else "0"]
    return []


def _node_env(trial: Trial, node: int, tmp_path) -> dict[str, str]:
    """The environment of launch agent ``node`` (and so of its workers): its name
    (``ET_TEST_NODE``) and, on clock_skew's skewed node, the skewed clock."""
    env = {**os.environ, "ET_TEST_NODE": str(node)}
    if trial.kind == "clock_skew" and node == trial.detail("skewed_node"):
        env.update(PYTHONPATH=os.pathsep.join(p for p in (SKEWED_CLOCK,
                                                          os.environ.get("PYTHONPATH")) if p),
                   ET_TEST_NODE_CLOCK_SKEW_S=str(trial.detail("skew_s")),
                   ET_TEST_NODE_CLOCK_DIR=str(tmp_path / "clock"))
    return env


def _write_atomically(path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


def _check_clock_skew(trial: Trial, run_storage: RunStorage, tmp_path,
                      agent_pids: list[int]) -> None:
    """The skewed node ran skewed (its agent and a worker), and the failure the raising
    node's worker caused was charged to that node (run.json)."""
    skewed_agent = agent_pids[int(trial.detail("skewed_node"))]
    seen = {}
    for record in (tmp_path / "clock").iterdir():  # pid -> its time.time() - the real one
        seen[int(record.name)] = float(record.read_text()) - os.path.getmtime(record)
    skew = trial.detail("skew_s")
    assert skewed_agent in seen, f"the skewed node's agent did not run skewed: {seen}"
    workers = [int(p.name.split("-")[1]) for p in (tmp_path / "out").glob("pid-*")]
    assert set(workers) & set(seen), f"no worker ran skewed: {workers}, {seen}"
    off = {pid: round(s - skew, 3) for pid, s in seen.items() if abs(s - skew) > 0.5}
    assert not off, f"processes skewed by other than {skew} s: {off}"
    raised = int((tmp_path / "out" / "crashed").read_text())  # the raising worker's rank
    state = run_storage.read_run_state()
    print("clock_skew run.json failures:", [(f.kind.value, [(w.rank, w.message[:80])
                                                            for w in f.workers])
                                            for f in state.failures])
    assert len(state.failures) == 1, f"one failure, recorded once: {state.failures}"
    [failure] = state.failures
    assert failure.root.rank == raised, \
        f"rank {raised} raised, but run.json names rank {failure.root.rank} " \
        f"({failure.kind.value}): {failure.root.message}"
    # run.json is group rank 0's record: its own failure, or free (another node's)
    expected = "failure" if raised == 0 else "peer"
    assert failure.kind.value == expected, \
        f"rank {raised} raised, but group rank 0 recorded {failure.kind.value}"


def _inject_launch_fault(kind: str, second: subprocess.Popen, etcd: EtcdServer | None,
                         tmp_path, endpoint: str, name: str) -> list[int]:
    """The fault of a launch trial; returns the pids of the faulted node that must be gone."""
    if kind == "corrupt_rdzv_state" and etcd is None:
        corrupt_c10d_state(endpoint, name)  # torch's handler reads it every monitor pass
        return []
    if kind == "corrupt_rdzv_state":
        corrupt_etcd_round(endpoint, name)  # read at the next rendezvous: a node goes
    if kind in ("agent_sigkill", "corrupt_rdzv_state"):
        second.kill()
        second.wait()
        return []
    if kind == "node_sigterm":
        pids = signal_tree(second.pid, signal.SIGTERM)
        assert second.wait(60) == 128 + signal.SIGTERM, \
            (tmp_path / "agent1.log").read_text()[-3000:]
        return pids
    etcd.kill()
    time.sleep(2)
    etcd.start()
    assert second.wait(150) == 0, (tmp_path / "agent1.log").read_text()[-3000:]
    return []


def _restore_after_corruption(agents: list, etcd: EtcdServer | None, storage: StorageUnderTest,
                              name: str, tmp_path) -> None:
    """The nodes of a job whose rendezvous state was overwritten stop with an error naming
    it and the fix (never "stopped unexpectedly"); done as it says, ``elastic-train
    restore`` continues the run (its output in restore.log)."""
    logs = []
    for i, (proc, _) in enumerate(agents):
        code = proc.wait(120)
        logs.append((tmp_path / f"agent{i}.log").read_text())
        assert code != 0, logs[-1][-3000:]
    said = "\n".join(logs)
    assert "rendezvous state" in said and "is corrupt" in said, said[-4000:]
    assert "stopped unexpectedly" not in said, said[-4000:]
    state = storage.run(name).read_run_state()
    assert state.status is RunStatus.RUNNING or "rendezvous" in (state.error or ""), state.error
    if etcd is not None:
        assert "etcdctl" in said, said[-4000:]
        delete_run_keys(etcd.endpoint, name)
    with open(tmp_path / "restore.log", "w") as log:
        restored = subprocess.run(
            [sys.executable, "-m", "elastic_train.cli", "restore", f"{storage.url}/{name}"],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True, timeout=150)
    assert restored.returncode == 0, (tmp_path / "restore.log").read_text()[-3000:]
