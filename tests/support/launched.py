"""``elastic-train launch`` in the e2e tests: starting agents (one, several of one job, a
node in a process group of its own) with ``tests/e2e/scripts/launch_script.py``, and what
they read back: the starts and ranks the script recorded, its workers' pids, a run's
stored state and ``elastic-train show``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

from elastic_train.storage import RunStorage
from elastic_train.storage import filesystem as fsutil
from tests.support.paths import REPO
from tests.support.servers import free_port, stop_process

SCRIPT = os.path.join(REPO, "tests/e2e/scripts/launch_script.py")
CLI = [sys.executable, "-m", "elastic_train.cli"]


def launch(*args, out=None, env=None) -> subprocess.Popen:
    """``elastic-train launch args...`` from the repository, its output to ``out`` (default
    a pipe), ``env`` added to this environment."""
    return subprocess.Popen([*CLI, "launch", *map(str, args)], cwd=REPO, text=True,
                            stdout=out or subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=None if env is None else {**os.environ, **env})


def run_nodes(tmp_path, count, *args, timeout=180) -> list[int]:
    """``count`` agents of one job (``--nnodes count``, one worker each) on a c10d endpoint
    of this machine, node 0 first (it hosts the store); their exit codes. Each node's
    output is in ``tmp_path/node<i>.log``."""
    endpoint = f"127.0.0.1:{free_port()}"
    logs = [open(tmp_path / f"node{i}.log", "w") for i in range(count)]  # noqa: SIM115
    procs = []
    try:
        for i, log in enumerate(logs):
            procs.append(launch("--nnodes", count, "--nproc-per-node", 1, "--rdzv-backend",
                                "c10d", "--rdzv-endpoint", endpoint, *args, out=log))
            if i == 0:
                time.sleep(2)  # node 0 hosts the c10d store
        return [p.wait(timeout) for p in procs]
    finally:
        for proc in procs:
            stop_process(proc)
        for log in logs:
            log.close()


def start_node(args: list, log, node: int = 0) -> subprocess.Popen:
    """An agent in its own process group, so that the node can be killed whole; its
    workers see ``ET_TEST_NODE=node``."""
    return subprocess.Popen([*CLI, "launch", *map(str, args)], cwd=REPO, text=True,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "ET_TEST_NODE": str(node)})


def rdzv_args(request, backend: str) -> list[str]:
    """``--rdzv-backend`` and ``--rdzv-endpoint``: the test's etcd, or a free c10d port."""
    endpoint = (request.getfixturevalue("etcd_endpoint") if backend == "etcd"
                else f"127.0.0.1:{free_port()}")
    return ["--rdzv-backend", backend, "--rdzv-endpoint", endpoint]


def worker_pids(out_dir) -> list[int]:
    """The pids of every worker the script ran (its ``pid-<pid>`` files)."""
    return [int(p.name.split("-")[1]) for p in out_dir.glob("pid-*")]


def rank_starts(out_dir) -> list[tuple[int, int, int, int]]:
    """(rank, world size, pid, node) of every rank's every start."""
    path = out_dir / "ranks"
    return [tuple(map(int, line.split())) for line in path.read_text().splitlines()] \
        if path.exists() else []


def show(storage_path: str, name: str, *flags: str) -> str:
    """What ``elastic-train show`` prints of the run (it must succeed)."""
    shown = subprocess.run([*CLI, "show", os.path.join(storage_path, name), *flags],
                           cwd=REPO, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


def starts(out_dir) -> list[tuple[int, int]]:
    """(first epoch, world size) of each start of the script's rank 0."""
    path = out_dir / "starts"
    return [tuple(map(int, line.split())) for line in path.read_text().splitlines()] \
        if path.exists() else []


def latest_world(out_dir) -> int | None:
    """World size of the script's latest start (None before its first).

    A test of ``--nnodes 2:3`` that needs all three nodes waits for this to be 3, not for
    the first start to be: on a loaded machine the third agent may miss the first round's
    last call (2 s) and join the running job a moment later."""
    recorded = starts(out_dir)
    return recorded[-1][1] if recorded else None


def run_state(storage_path: str, name: str) -> dict[str, Any]:
    """The run's run.json, as stored."""
    fs, path = fsutil.resolve(os.path.join(storage_path, name))
    return RunStorage(fs, path).read_run_state().to_json()
