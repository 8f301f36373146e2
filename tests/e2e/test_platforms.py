"""A bare ``elastic-train launch SCRIPT`` in the environment each platform gives a node, with
real agents on 127.0.0.1: a Kubeflow PyTorchJob (static and elastic), Kubeflow's default
``PET_NPROC_PER_NODE=auto``, a Slurm allocation (from the SLURM_* variables alone, and a
requeued job continuing its run), and ``--dry-run`` on compressed node lists."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

from tests.conftest import wait_until
from tests.support.launched import run_state, starts
from tests.support.paths import REPO
from tests.support.servers import free_port, stop_process

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300),
              pytest.mark.usefixtures("no_leaked_processes")]

SCRIPT = "tests/e2e/scripts/launch_script.py"
CLI = [sys.executable, "-m", "elastic_train.cli"]


def node_env(**values: object) -> dict[str, str]:
    """This environment without torchrun's or Slurm's variables, plus ``values``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PET_", "SLURM_", "MASTER_"))}
    return {**env, **{k: str(v) for k, v in values.items()}}


def launch_nodes(envs, tmp_path, *args, tag="node"):
    """One bare ``launch`` per environment; node 0 first (it hosts the store)."""
    procs = []
    for i, env in enumerate(envs):
        log = open(tmp_path / f"{tag}{i}.log", "w")  # noqa: SIM115 (closed by finish)
        procs.append((subprocess.Popen([*CLI, "launch", *map(str, args)], cwd=REPO, env=env,
                                       stdout=log, stderr=subprocess.STDOUT, text=True), log))
        if i == 0 and len(envs) > 1:
            time.sleep(2)
    return procs


def finish(procs, tmp_path, tag="node", timeout=200):
    """Waits for every node; returns the exit codes (the logs on failure)."""
    try:
        codes = [proc.wait(timeout) for proc, _ in procs]
    finally:
        for proc, log in procs:
            stop_process(proc)
            log.close()
    logs = [(tmp_path / f"{tag}{i}.log").read_text()[-3000:] for i in range(len(procs))]
    return codes, logs


def test_kubeflow_static_pytorchjob_two_nodes(storage_path, tmp_path):
    """The operator's variables for a master and a worker replica, no elastic policy."""
    port = free_port()
    common = {"PET_NNODES": 2, "PET_NPROC_PER_NODE": 1, "PET_MASTER_ADDR": "127.0.0.1",
              "PET_MASTER_PORT": port, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
              "WORLD_SIZE": 2, "PYTHONUNBUFFERED": 1, "PET_STORAGE_PATH": storage_path}
    envs = [node_env(**common, PET_NODE_RANK=rank, RANK=rank) for rank in (0, 1)]
    codes, logs = finish(launch_nodes(envs, tmp_path, SCRIPT, tmp_path, 3), tmp_path)
    assert codes == [0, 0], logs
    assert starts(tmp_path) == [(0, 2)]
    name = f"static-127.0.0.1-{port}"  # a real pod's master is <job>-master-0: the job's name
    assert run_state(storage_path, name)["status"] == "finished"


def test_kubeflow_elastic_pytorchjob_two_nodes(storage_path, tmp_path):
    """The operator's variables for an elastic policy (c10d on worker 0, nnodes 2:2)."""
    job = f"kf-{uuid.uuid4().hex[:6]}"
    common = {"PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": f"127.0.0.1:{free_port()}",
              "PET_RDZV_ID": job, "PET_NNODES": "2:2", "PET_NPROC_PER_NODE": 1,
              "PET_MAX_RESTARTS": 1, "PET_STORAGE_PATH": storage_path}
    envs = [node_env(**common) for _ in range(2)]
    codes, logs = finish(launch_nodes(envs, tmp_path, SCRIPT, tmp_path, 3), tmp_path)
    assert codes == [0, 0], logs
    assert starts(tmp_path) == [(0, 2)]
    state = run_state(storage_path, job)
    assert state["status"] == "finished" and state["spec"]["launch"]["max_restarts"] == 1


def test_pet_nproc_per_node_auto(storage_path, tmp_path):
    """Kubeflow's default: every command still works, and launch runs one worker per CPU
    (this node has no accelerator)."""
    env = node_env(PET_NPROC_PER_NODE="auto", PET_STORAGE_PATH=storage_path)
    for command in (["--help"], ["ls", str(tmp_path)]):
        done = subprocess.run([*CLI, *command], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    codes, logs = finish(launch_nodes([env], tmp_path, "--standalone",
                                      "tests/e2e/scripts/plain_torchrun_script.py"), tmp_path)
    cpus = len(os.sched_getaffinity(0))
    assert codes == [0], logs
    assert f"[rank0]: ENV rank=0 world={cpus} sum={cpus} missing=[]" in logs[0]


def _slurm_job() -> tuple[str, int]:
    """A job id whose derived rendezvous port is free here."""
    while True:
        job = random.randrange(100000, 999999)
        port = 20000 + job % 10000
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return str(job), port


def test_slurm_two_nodes_from_slurm_variables_alone_and_a_requeue(storage_path, tmp_path):
    """``srun elastic-train launch SCRIPT`` on each node of an allocation; then the job is
    preempted (SIGTERM on every node) and requeued (same job id): it continues its run."""
    job, _ = _slurm_job()
    common = {"SLURM_JOB_ID": job, "SLURM_JOB_NUM_NODES": 2, "SLURM_NNODES": 2,
              "SLURM_JOB_NODELIST": "127.0.0.[1-2]", "SLURM_NTASKS_PER_NODE": 1,
              "PET_STORAGE_PATH": storage_path, "PET_PREEMPTION_GRACE": 2}
    envs = [node_env(**common, SLURM_NODEID=i, SLURM_PROCID=i) for i in (0, 1)]
    args = (SCRIPT, tmp_path, 8, "--sleep", 0.5)
    procs = launch_nodes(envs, tmp_path, *args, tag="first")
    marker = os.path.join(storage_path, job, "checkpoint_000002", ".commit.json")
    try:
        assert wait_until(lambda: os.path.exists(marker), 150), "no checkpoint committed"
        for proc, _ in procs:
            proc.send_signal(signal.SIGTERM)  # Slurm preempts the job
    finally:
        codes, logs = finish(procs, tmp_path, tag="first", timeout=60)
    assert codes == [128 + signal.SIGTERM] * 2, logs
    assert run_state(storage_path, job)["status"] == "interrupted"

    codes, logs = finish(launch_nodes(envs, tmp_path, *args, tag="requeued"), tmp_path,
                         tag="requeued")
    assert codes == [0, 0], logs
    assert starts(tmp_path)[0] == (0, 2) and starts(tmp_path)[-1][0] >= 3
    state = run_state(storage_path, job)
    assert state["status"] == "finished" and len(state["launches"]) == 2


def test_dry_run_on_compressed_node_lists(tmp_path):
    env = node_env(SLURM_JOB_ID="5150", SLURM_JOB_NUM_NODES=6, SLURM_NODEID=4,
                   SLURM_JOB_NODELIST="rack[2-3]-gpu[07-08],login9", SLURM_GPUS_ON_NODE=0,
                   SLURM_NTASKS_PER_NODE=2, MASTER_PORT=29123)
    done = subprocess.run([*CLI, "launch", "--dry-run", SCRIPT], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["rdzv_endpoint"] == {"value": "rack2-gpu07:29123",
                                    "source": "SLURM_JOB_NODELIST, MASTER_PORT"}
    assert got["nnodes"]["value"] == 6 and got["nproc_per_node"]["value"] == 2
    assert got["rdzv_id"]["value"] == "5150" and got["name"]["value"] == "5150"
    assert not (tmp_path / "results").exists()  # nothing started, nothing written

    bad = subprocess.run([*CLI, "launch", "--dry-run", SCRIPT], cwd=REPO, capture_output=True,
                         text=True, timeout=120,
                         env={**env, "SLURM_JOB_NODELIST": "rack[2-3-gpu7"})
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "SLURM_JOB_NODELIST='rack[2-3-gpu7'" in bad.stderr
