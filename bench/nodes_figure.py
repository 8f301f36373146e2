"""Figure 13: a worker fails on one node of a 3-node job -- what restarts on the other nodes.

Three agents on this machine form one job (c10d, ``--nnodes 3``, one worker
each) and train the common workload; rank 1's worker exits with code 1 after
a few steps of epoch 2. torchrun restarts every node's workers (the failed
node re-joins the rendezvous, the others see it waiting and restart theirs);
``elastic-train launch`` does the same for a plain script, and, for a script
whose main is wrapped by ``@elastic_train.restart_in_process``, starts a new
process for the failed rank only: the other nodes' workers run the train
function again in the processes they have. The figure counts the worker
processes started on the other nodes after the fault, and times the fault
to every rank's first step again.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bench import procs
from bench.events import Events
from bench.measure import FaultPlan, every_rank_back
from bench.report import Table
from bench.stats import Summary
from bench.variants import (
    ELASTIC_TRAIN_CLI,
    ET_LAUNCH,
    ET_LAUNCH_INPROC,
    FLOOR,
    REPO,
    WORKER_SCRIPT,
    Variant,
    base_env,
)

if TYPE_CHECKING:
    from bench.suite import Suite

NODES = 3
VARIANTS = (FLOOR, ET_LAUNCH, ET_LAUNCH_INPROC)
# torchrun's multi-node restarts work with an unshared store (figure 8b); the per-restart
# prefix of (a') does not: a node restarted for a membership change keeps its count.
TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


@dataclass
class NodesRun:
    """One job: seconds from the fault to every rank stepping again, and the worker
    processes started on the nodes that did not fail (None: not measured)."""

    recovery_s: float | None = None
    restarted_elsewhere: int | None = None
    error: str = ""


def _command(variant: Variant, endpoint: str, run_id: str, storage: str,
             config: str) -> list[str]:
    flags = ["--nnodes", str(NODES), "--nproc-per-node", "1", "--rdzv-backend", "c10d",
             "--rdzv-endpoint", endpoint, "--rdzv-id", run_id, "--max-restarts", "1"]
    if variant is FLOOR:
        return [sys.executable, "-m", "torch.distributed.run", *flags, WORKER_SCRIPT, config]
    return [*ELASTIC_TRAIN_CLI, "launch", *flags, "--storage-path", storage, "--name", run_id,
            WORKER_SCRIPT, config]


def run_job(variant: Variant, suite: Suite) -> NodesRun:
    profile = suite.profile
    work = tempfile.mkdtemp(prefix=f"bench-nodes-{variant.key}-")
    agents: list[subprocess.Popen[bytes]] = []
    try:
        events_dir = os.path.join(work, "events")
        fault = FaultPlan("exit", profile.fault.epoch, profile.fault.step, rank=1)
        cfg = fault.apply(variant.workload(profile.recovery)).replace(
            events_dir=events_dir, ckpt_dir=os.path.join(work, "ckpt"))
        os.makedirs(events_dir)
        os.makedirs(cfg.ckpt_dir)
        command = _command(variant, f"127.0.0.1:{procs.free_port()}", "nodes",
                           os.path.join(work, "runs"), cfg.to_json())
        for node in range(NODES):
            with open(os.path.join(work, f"node{node}.log"), "wb") as log:
                agents.append(subprocess.Popen(
                    command, env={**base_env(cfg.threads, variant),
                                  **(TORCHRUN_ENV if variant is FLOOR else {})},
                    cwd=REPO, stdout=log,
                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True))
            if node == 0:
                time.sleep(1.5)  # the first agent binds the endpoint: it hosts the store
        codes = [_wait(agent, profile.timeout_s) for agent in agents]
        events = Events.read(events_dir)
        result = _measured(events)
        if codes != [0] * NODES:
            with open(os.path.join(work, "node0.log"), "rb") as f:
                result.error = (f"exit codes {codes}: ..."
                                f"{f.read()[-600:].decode(errors='replace')}")
        return result
    finally:
        for agent in agents:
            procs.kill_tree(agent.pid)
        shutil.rmtree(work, ignore_errors=True)


def _wait(agent: subprocess.Popen[bytes], timeout_s: float) -> int | None:
    try:
        return agent.wait(timeout_s)
    except subprocess.TimeoutExpired:
        return None


def _measured(events: Events) -> NodesRun:
    fault = events.time_of("fault", rank=None)
    if fault is None:
        return NodesRun()
    back = every_rank_back(events, NODES, fault)
    pids = events.pids_by_rank()
    return NodesRun(recovery_s=back - fault if back is not None else None,
                    restarted_elsewhere=sum(len(set(pids.get(rank, []))) - 1
                                            for rank in (0, 2)))


def nodes(suite: Suite) -> list[Table]:
    """Figure 13."""
    table = Table("Figure 13 — a worker fails on one node of a 3-node job (s, median (min–max))",
                  ["variant", "recovered", "worker processes started on the other nodes",
                   "fault → every rank stepping again"])
    for variant in suite.variants(*VARIANTS):
        runs = []
        for rep in range(suite.profile.repeat):
            run = run_job(variant, suite)
            status = "ok" if not run.error else f"FAILED, {run.error[:120]}"
            suite.echo(f"  [nodes] {variant.label}, rep {rep + 1}: {status}")
            runs.append(run)
        table.add(variant.label, f"{sum(r.recovery_s is not None for r in runs)}/{len(runs)}",
                  Summary.of([r.restarted_elsewhere for r in runs]).fmt(0),
                  Summary.of([r.recovery_s for r in runs]).fmt())
    cfg, fault = suite.profile.recovery, suite.profile.fault
    table.notes += [
        f"{NODES} agents on this machine (c10d, --nnodes {NODES}, 1 worker each); rank 1's "
        f"worker exits with code 1 after step {fault.step + 1} of epoch {fault.epoch + 1} "
        f"({cfg.steps_per_epoch} steps per epoch), first attempt only.",
        "Worker processes started on the other nodes: new worker pids of ranks 0 and 2 after "
        "their first (0: their processes ran on).",
        "(a) is torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (each restart a fresh "
        "env:// store on rank 0, as elastic-train launch uses): its multi-node restarts do "
        "not work with the agent's shared store (figure 8b).",
    ]
    return [table]
