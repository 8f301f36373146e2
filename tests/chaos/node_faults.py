"""The chaos suite's faults on node care: nodes sent away, slow nodes, spares (#26).

Each trial is a launched job of agents on our etcd handler running the launch script
(its digest does not depend on the world size, so every trial's final weights must
match the uninterrupted run's), the node of ``trial.rank`` being the one it is about:

``health_check_fails``: ``--nnodes 1:2`` under a health policy; that node's check
starts failing and its worker raises once, whereupon the node leaves (the check after
a failure charged to it) and the other finishes alone. ``node_fails_twice``: the
same under a policy that sends a node away after two failures in a row, its worker
raising in two attempts. Both: the departure is in ``run.json``. ``straggler``: that
node's rank sleeps 0.4 s more per epoch and is named in ``run.json``'s stragglers
(``--straggler-window 2``). ``node_lost_with_spare``: ``--nnodes 2 --spares 1`` with a
third agent parked; that node is SIGKILLed and the spare takes its place: every start
of the job has world size 2.
"""

from __future__ import annotations

import os
import subprocess
import sys

from elastic_train.storage import RunStorage
from tests.chaos.faults import (
    EPOCHS,
    LAUNCH_SCRIPT,
    Outcome,
    StorageWatcher,
    Trial,
    _at_fault_time,
    _launched_outcome,
    _write_atomically,
)
from tests.conftest import StorageUnderTest, wait_until
from tests.support.etcd_server import EtcdServer, etcd_binary, run_keys
from tests.support.node_policies import SICK_FILE
from tests.support.paths import REPO
from tests.support.process_tree import stop_logged

NAMES = ("127.0.0.1", "localhost", "127.0.0.1")  # --local-addr: the third is the spare
POLICIES = {"health_check_fails": "tests.support.node_policies:SickWhileMarked",
            "node_fails_twice": "tests.support.node_policies:LeaveAfterTwoInARow"}
LEAVES = ("health_check_fails", "node_fails_twice")


def _flags(kind: str) -> list[str]:
    """The launch flags of every agent of a ``kind`` trial."""
    flags = ["--nnodes", "2", "--spares", "1"] if kind == "node_lost_with_spare" \
        else ["--nnodes", "1:2"]
    if kind in POLICIES:
        flags += ["--rdzv-conf", f"node_policy={POLICIES[kind]}"]
    if kind == "straggler":
        flags += ["--straggler-window", "2"]
    return [*flags, "--max-restarts", "3"]


def _script_flags(trial: Trial, tmp_path) -> list[str]:
    """The launch script's flags: epochs longer than a spare takes to park, for the spare;
    a crash (two, for node_fails_twice) on the trial's node; its rank's extra sleep."""
    sleep = "2" if trial.kind == "node_lost_with_spare" else "0.3"
    flags = ["--sleep", sleep, "--slow-until-world", "2"]
    if trial.kind in LEAVES:
        flags += ["--crash-file", str(tmp_path / "crash"),
                  "--crash-times", "2" if trial.kind == "node_fails_twice" else "1"]
    if trial.kind == "straggler":
        flags += ["--slow-rank", f"{trial.rank}:0.4"]
    return flags


def _parked(endpoint: str, run_id: str) -> bool:
    """Whether a spare waits in our etcd handler (``r/<round>/s/<node>``)."""
    return any(b"/s/" in key for key in run_keys(endpoint, run_id))


def _worlds(out_dir) -> list[int]:
    starts = out_dir / "starts"
    return [int(line.split()[1]) for line in starts.read_text().splitlines()] \
        if starts.exists() else []


def run_node_trial(trial: Trial, storage: StorageUnderTest, tmp_path, name: str) -> Outcome:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    etcd = EtcdServer(etcd_binary())
    etcd.start()
    run_storage = storage.run(name)
    agents: list[tuple[subprocess.Popen, object]] = []
    faulted = trial.rank  # the agent the trial is about (a node of the first two)

    def agent(i: int) -> subprocess.Popen:
        log = open(tmp_path / f"agent{i}.log", "w")  # noqa: SIM115 (closed with the agent)
        env = {**os.environ, "ET_TEST_NODE": NAMES[i], SICK_FILE: str(tmp_path / f"sick{i}")}
        proc = subprocess.Popen(
            [sys.executable, "-m", "elastic_train.cli", "launch", "--nproc-per-node", "1",
             "--rdzv-backend", "etcd", "--rdzv-endpoint", etcd.endpoint, "--rdzv-id", name,
             "--local-addr", NAMES[i], *_flags(trial.kind), "--storage-path", storage.url,
             LAUNCH_SCRIPT, str(out_dir), str(EPOCHS + 3), *_script_flags(trial, tmp_path)],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
        agents.append((proc, log))
        return proc

    def log_of(i: int) -> str:
        return (tmp_path / f"agent{i}.log").read_text()

    codes: dict[int, int] = {}
    with StorageWatcher(run_storage) as watcher:
        try:
            agent(0)
            assert wait_until(lambda: any(k.endswith(b"/c/sealer")
                                          for k in run_keys(etcd.endpoint, name)), 60)
            agent(1)
            if trial.kind == "node_lost_with_spare":  # once the job has its two nodes
                assert wait_until(lambda: 2 in _worlds(out_dir), 120), log_of(1)[-3000:]
                agent(2)
                assert wait_until(lambda: _parked(etcd.endpoint, name), 120), \
                    log_of(2)[-3000:]
            assert _at_fault_time(trial, storage, name, tmp_path, world_size=2), \
                "no checkpoint of the two-node job"
            if trial.kind == "health_check_fails":
                (tmp_path / f"sick{faulted}").touch()
            if trial.kind in LEAVES:
                _write_atomically(tmp_path / "crash", NAMES[faulted])
            if trial.kind == "node_lost_with_spare":
                agents[faulted][0].kill()  # its worker dies with its agent
                agents[faulted][0].wait()
            for i, (proc, _) in enumerate(agents):
                if not (trial.kind == "node_lost_with_spare" and i == faulted):
                    codes[i] = proc.wait(180)
        finally:
            stop_logged(agents)
            etcd.stop()
    logs = "".join(log_of(i) for i in range(len(agents)))
    outcome = _launched_outcome(logs, run_storage, watcher, tmp_path, out_dir)
    outcome.kind_failures = _kind_checks(trial, run_storage, codes, log_of, out_dir)
    return outcome


def _kind_checks(trial: Trial, run_storage: RunStorage, codes: dict[int, int], log_of,
                 out_dir) -> list[str]:
    """What each kind must show beyond the suite's checks; the ones that failed."""
    failed = []
    faulted = trial.rank
    survivors = {i: code for i, code in codes.items() if i != faulted or trial.kind
                 not in LEAVES}
    if any(survivors.values()):
        failed.append(f"a node that should have finished exited {survivors}")
    state = run_storage.read_run_state()
    if trial.kind in LEAVES:
        why = "health check" if trial.kind == "health_check_fails" else "2 failures in a row"
        if codes.get(faulted) != 1 or f"left the job: {why}" not in log_of(faulted):
            failed.append(f"node {NAMES[faulted]} did not leave for '{why}' "
                          f"(exit {codes.get(faulted)})")
        if [d.node for d in state.departures] != [NAMES[faulted]]:
            failed.append(f"run.json's departures: {state.departures}")
    if trial.kind == "straggler" and trial.rank not in [s.rank for s in state.stragglers]:
        failed.append(f"rank {trial.rank} slept and was not named: {state.stragglers}")
    if trial.kind == "node_lost_with_spare" and set(_worlds(out_dir)) != {2}:
        failed.append(f"the world size was not kept: starts at {_worlds(out_dir)}")
    return failed
