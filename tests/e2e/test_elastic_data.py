"""Elastic data with real agents: when the world size changes, every sample is still
trained on exactly once per epoch.

The script (``elastic_data_script.py``) all-reduces a per-sample visit counter each step
and checkpoints it with the data's position, every 5 steps and after each epoch; a node
SIGKILLs its whole process group at a chosen step, so the loss lands where the test
says. At the end each epoch's counter must be 1 for every sample.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch

from tests.conftest import wait_until
from tests.support.launched import CLI, run_state, starts
from tests.support.paths import REPO
from tests.support.servers import free_port, stop_process

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("no_leaked_processes")]

SCRIPT = os.path.join(REPO, "tests/e2e/scripts/elastic_data_script.py")
EPOCHS = 3


def _node(args: list, log, node: int) -> subprocess.Popen:
    """An agent in a session of its own (its node can be lost whole); its workers see
    ``ET_TEST_NODE=node``."""
    return subprocess.Popen([*CLI, "launch", *map(str, args)], cwd=REPO, text=True,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "ET_TEST_NODE": str(node)})


def _job(request, tmp_path, storage_path, backend: str, name: str, script_args: list,
         nodes: int = 2, late: tuple[int, ...] = (), rejoin: int | None = None,
         nnodes: str = "1:2", nproc: int = 1) -> list[str]:
    """Runs one job of ``nodes`` agents (``--nnodes 1:2``, one worker each) to its end;
    the nodes in ``late`` start once the first has begun training; ``rejoin``: the node
    started again (a new agent) once the job went on without it. Returns the logs; the
    script's files are in ``tmp_path/out``."""
    endpoint = (request.getfixturevalue("etcd_endpoint") if backend == "etcd"
                else f"127.0.0.1:{free_port()}")
    out = tmp_path / "out"
    out.mkdir()
    logs = [open(tmp_path / f"node{i}.log", "w") for i in range(nodes + 1)]  # noqa: SIM115

    def start(i: int, log) -> subprocess.Popen:
        return _node(["--nnodes", nnodes, "--nproc-per-node", nproc, "--rdzv-backend", backend,
                      "--rdzv-endpoint", endpoint, "--rdzv-id", name, "--name", name,
                      "--max-restarts", 3,
                      "--unwind-timeout", 2, "--storage-path", storage_path, SCRIPT, out,
                      EPOCHS, *script_args], log, i)

    procs: list[subprocess.Popen] = []
    try:
        for i in range(nodes):
            if i in late:
                assert wait_until(lambda: starts(out), 90), starts(out)
            elif i > 0 and backend == "c10d":
                time.sleep(2)  # node 0 hosts the c10d store: it must outlive the others
            procs.append(start(i, logs[i]))
        if rejoin is not None:
            lost = procs[rejoin]
            lost.wait(120)
            assert wait_until(lambda: starts(out)[-1][1] == 1, 60), starts(out)
            procs.append(start(rejoin, logs[nodes]))
        assert procs[0].wait(150) == 0, (tmp_path / "node0.log").read_text()[-3000:]
    finally:
        for proc in procs:
            stop_process(proc)
        for log in logs:
            log.close()
    visits = torch.load(out / "visits.pt", weights_only=True)
    said = [(tmp_path / f"node{i}.log").read_text() for i in range(nodes + 1)]
    assert visits.shape == (EPOCHS, 480)
    assert torch.equal(visits, torch.ones_like(visits)), (
        starts(out), [(e, int((v != 1).sum())) for e, v in enumerate(visits)], said[0][-3000:])
    assert run_state(storage_path, name)["status"] == "finished"
    return said


def _restores(storage_path: str, name: str) -> list[dict]:
    with open(os.path.join(storage_path, name, "restores.json")) as f:
        return json.load(f)


@pytest.mark.timeout(240)
# etcd's shrink runs in CI through the global-batch test below (also a visit count)
@pytest.mark.parametrize("backend", ["c10d", pytest.param("etcd", marks=pytest.mark.long)])
def test_a_node_lost_mid_epoch_leaves_the_rest_of_the_epoch_to_the_survivor(
        request, tmp_path, storage_path, backend):
    name = f"shrink-{backend}"
    logs = _job(request, tmp_path, storage_path, backend, name, ["--lose-node", "1:1:12"])
    assert "Elastic data: loader:0: world 2 -> 1 at epoch 1, sample 160/480" in logs[0]
    # the last resize (on a loaded machine node 0 may form alone first, then grow to 2)
    *_, record = [r for r in _restores(storage_path, name) if r.get("data")]
    assert record["data"] == ["loader:0: world 2 -> 1 at epoch 1, sample 160/480: the "
                              "remaining 320 samples split over 1 rank(s)"]


@pytest.mark.long  # 20-35 s: the long profile (python -m pytest -m long)
@pytest.mark.timeout(240)
def test_a_node_lost_right_after_an_epochs_end_and_one_that_joins_mid_epoch(
        request, tmp_path, storage_path):
    """Node 1 is lost at epoch 1's last step (after the in-epoch checkpoint of the
    whole epoch), then a new agent on node 1 joins while the survivor trains alone
    (world 1 -> 2 mid-epoch): two changes, each sample once per epoch."""
    _job(request, tmp_path, storage_path, "etcd", "shrink-grow",
         ["--lose-node", "1:1:29", "--checkpoint-every", 3, "--sleep", 0.15], rejoin=1)
    worlds = [w for _, w in starts(tmp_path / "out")]
    assert worlds[0] == 2 and worlds[-1] == 2 and 1 in worlds, starts(tmp_path / "out")


@pytest.mark.long
@pytest.mark.timeout(240)
def test_a_node_joining_mid_epoch_takes_half_of_the_rest(request, tmp_path, storage_path):
    """Node 0 trains alone (``--nnodes 1:2``); node 1 joins during the first epochs."""
    _job(request, tmp_path, storage_path, "etcd", "grow", ["--sleep", 0.05], late=(1,))
    assert [w for _, w in starts(tmp_path / "out")][-1] == 2


@pytest.mark.timeout(300)
def test_a_constant_global_batch_ends_with_the_weights_of_an_uninterrupted_run(
        request, tmp_path, storage_path):
    """``global_batch_size=16`` with micro-batches of 8: two ranks step on 16 samples; after
    node 1 is lost mid-epoch the survivor accumulates two micro-batches per step, on the
    same 16 samples. The final weights match a run that kept both ranks, to float
    rounding (the sums run in another order)."""
    args = ["--global-batch", 16, "--sleep", 0.02]
    reference = tmp_path / "reference"
    reference.mkdir()
    _job(request, reference, storage_path, "c10d", "global-reference", args, nodes=1,
         nnodes="1", nproc=2)
    shrunk = tmp_path / "shrunk"
    shrunk.mkdir()
    logs = _job(request, shrunk, storage_path, "etcd", "global-shrunk",
                [*args, "--lose-node", "1:1:12"])
    assert "global batch 16 kept by 2 accumulation step(s)" in logs[0]
    assert [w for _, w in starts(shrunk / "out")][-2:] == [2, 1]
    want = torch.load(reference / "out" / "weights.pt", weights_only=True)
    got = torch.load(shrunk / "out" / "weights.pt", weights_only=True)
    for key, value in want.items():
        # measured: at most 1.2e-7 apart on weights of about 2 (float32 sums in another order)
        torch.testing.assert_close(got[key], value, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(180)
def test_the_elastic_data_guides_code_runs(tmp_path):
    """docs/elastic-data.md's example, as a user's script (its runs under a HOME of the
    test's)."""
    guide = os.path.join(REPO, "docs", "elastic-data.md")
    with open(guide) as f:
        [block] = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    script = tmp_path / "guide.py"
    script.write_text(block)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, text=True,
                          capture_output=True, timeout=150,
                          env={**os.environ, "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "steps of 64 samples, final loss" in done.stdout


@pytest.mark.timeout(240)
def test_fit_with_num_workers_min_max_loses_a_node_and_its_shards_rows_are_trained_once(
        etcd_endpoint, tmp_path, storage_path):
    """``ScalingConfig(num_workers=(1, 2))`` under ``fit()``: two drivers (one worker
    each); node 1's driver is SIGKILLed mid-epoch; the survivor's dataset shard trains on
    the rest of the epoch, each row once."""
    name = "fit-shrink"
    out = tmp_path / "out"
    out.mkdir()
    logs = [open(tmp_path / f"node{i}.log", "w") for i in (0, 1)]  # noqa: SIM115
    procs = [subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.scripts.elastic_data_driver", storage_path, name,
         str(out), etcd_endpoint, str(EPOCHS)], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
        text=True, start_new_session=True, env={**os.environ, "ET_TEST_NODE": str(i)})
        for i, log in enumerate(logs)]
    try:
        code = procs[0].wait(200)
    finally:
        for proc in procs:
            stop_process(proc)
        for log in logs:
            log.close()
    said = (tmp_path / "node0.log").read_text()
    assert code == 0, said[-3000:]
    worlds = (out / "worlds").read_text().split()
    assert worlds[-2:] == ["2", "1"], worlds  # (node 0 may form alone first when loaded)
    visits = torch.load(out / "visits.pt", weights_only=True)
    assert torch.equal(visits, torch.ones_like(visits)), \
        [(e, int((v != 1).sum())) for e, v in enumerate(visits)]
    *_, record = [r for r in _restores(storage_path, name) if r.get("data")]
    assert record["data"] == ["dataset:train: world 2 -> 1 at epoch 1, sample 160/480: the "
                              "remaining 320 samples split over 1 rank(s)"]


@pytest.mark.timeout(120)
def test_a_loader_whose_iterator_is_never_exhausted_resumes_at_the_next_epoch(
        request, tmp_path, storage_path):
    """``zip(range(len(loader)), loader)`` takes every batch of a pass but never asks the
    loader for the end. A restart from the checkpoint after the loop (``epoch + 1``)
    goes on with the next epoch, whose every sample is trained on once (not an empty
    pass that skips it)."""
    _job(request, tmp_path, storage_path, "c10d", "zip-resume",
         ["--zip", "--fail-after-epoch", 0, "--checkpoint-every", 1000, "--sleep", 0],
         nodes=1, nnodes="1", nproc=2)
    assert [s for s, _ in starts(tmp_path / "out")] == [0, 1], starts(tmp_path / "out")


@pytest.mark.timeout(120)
def test_a_global_batch_a_later_world_cannot_divide_is_refused_at_once_and_not_retried(
        tmp_path, storage_path):
    """``--nnodes 1:2`` (one worker each) with a global batch of 3: it divides at world 1,
    not at 2, the world a second node makes. Refused at the first attempt, at world 1,
    as a ConfigError that is not retried (``--max-restarts 3`` left as it was)."""
    out = tmp_path / "out"
    out.mkdir()
    with open(tmp_path / "node0.log", "w") as log:
        node = _node(["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                      f"127.0.0.1:{free_port()}", "--rdzv-id", "odd", "--name", "odd",
                      "--max-restarts", 3, "--storage-path", storage_path, SCRIPT, out,
                      EPOCHS, "--global-batch", 3], log, 0)
        try:
            code = node.wait(90)
        finally:
            stop_process(node)
    said = (tmp_path / "node0.log").read_text()
    assert code != 0, said[-3000:]
    state = run_state(storage_path, "odd")
    assert len(state["failures"]) == 1 and state["status"] == "failed", said[-3000:]
    assert "cannot be split over 2 workers (this job may run at 1, 2)" in said
    assert "it was not retried" in said, said[-3000:]
