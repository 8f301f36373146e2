"""Live recovery across nodes, under ``launch`` (c10d, one worker a node, a constant global
batch): a node lost, a node joining, and a spare taking a lost node's place. The script
reports no checkpoint, so the state each new world trains on came from a survivor's
memory; every sample is trained on once per epoch; the final weights are those of an
uninterrupted run within float32 rounding (a world of 3 sums a step's gradients in
another order than one of 2)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
import torch

from tests.conftest import wait_until
from tests.support.launched import start_node
from tests.support.paths import REPO
from tests.support.servers import free_port, stop_process

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180),
              pytest.mark.usefixtures("no_leaked_processes")]

SCRIPT = os.path.join(REPO, "tests/e2e/scripts/live_launch_script.py")
EPOCHS, STEPS_PER_EPOCH, ROWS = 3, 10, 120


def _steps(out_dir) -> list[tuple[int, int]]:
    path = out_dir / "steps"
    return [tuple(map(int, line.split())) for line in path.read_text().splitlines()] \
        if path.exists() else []


def _starts(out_dir) -> list[tuple[int, int]]:
    return [tuple(map(int, line.split())) for line in (out_dir / "starts").read_text().split("\n")
            if line]


class Nodes:
    """Agents of one job on a c10d endpoint of this machine, each in a process group of
    its own (so that a node can be killed whole); stopped at the end, whatever happens."""

    def __init__(self, tmp_path, storage_path, name, *flags):
        self.tmp_path, self.out = tmp_path, tmp_path / "out"
        self.out.mkdir()
        self.args = ["--nproc-per-node", 1, "--rdzv-backend", "c10d", "--rdzv-endpoint",
                     f"127.0.0.1:{free_port()}", "--rdzv-id", name, "--max-restarts", 2,
                     "--unwind-timeout", 4, "--storage-path", storage_path, *flags,
                     SCRIPT, self.out, "--epochs", EPOCHS, "--sleep", 0.25]
        self.procs: list[subprocess.Popen] = []
        self.logs: list = []

    def start(self) -> subprocess.Popen:
        i = len(self.procs)
        self.logs.append(open(self.tmp_path / f"node{i}.log", "w"))  # noqa: SIM115
        self.procs.append(start_node(self.args, self.logs[-1], i))
        if i == 0:
            time.sleep(2)  # node 0 hosts the c10d store: it must outlive the others
        return self.procs[-1]

    def kill(self, i: int) -> None:
        os.killpg(self.procs[i].pid, 9)
        self.procs[i].wait(30)

    def tails(self) -> list[str]:
        return [(self.tmp_path / f"node{i}.log").read_text()[-3000:]
                for i in range(len(self.procs))]

    def __enter__(self) -> Nodes:
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            stop_process(proc)
        for log in self.logs:
            log.close()


@pytest.fixture(scope="module")
def two_node_run(tmp_path_factory):
    """The uninterrupted run at a world of 2: the reference weights."""
    path = tmp_path_factory.mktemp("live-nodes-baseline")
    with Nodes(path, str(path / "results"), "baseline", "--nnodes", 2) as nodes:
        nodes.start(), nodes.start()
        assert [p.wait(120) for p in nodes.procs] == [0, 0], nodes.tails()
    return torch.load(nodes.out / "final.pt")


def _assert_trained_once_and_close(out_dir, reference) -> dict:
    final = torch.load(out_dir / "final.pt")
    assert final["visits"].tolist() == [[1] * ROWS] * EPOCHS
    for name, tensor in reference["model"].items():
        torch.testing.assert_close(final["model"][name], tensor, rtol=1e-4, atol=1e-5)
    return final


def _wait_for_step(nodes: Nodes, step: int, world: int) -> None:
    assert wait_until(lambda: any(s >= step and w == world for s, w in _steps(nodes.out)), 90), \
        (_steps(nodes.out), nodes.tails())


def test_a_lost_node_costs_no_step(storage_path, tmp_path, two_node_run):
    """``--nnodes 2:3``: three nodes train, one that is not the store's host is lost. The
    two survivors go on, in their processes, from the last step they completed."""
    with Nodes(tmp_path, storage_path, "lost", "--nnodes", "2:3") as nodes:
        for _ in range(3):
            nodes.start()
        _wait_for_step(nodes, 4, 3)
        nodes.kill(2)
        codes = [p.wait(120) for p in nodes.procs[:2]]
    assert codes == [0, 0], nodes.tails()
    [first, *later] = _starts(nodes.out)
    assert first[0] == 0 and later and later[-1][1] == 2, _starts(nodes.out)
    completed = max(s for s, w in _steps(nodes.out) if w == 3)
    assert later[-1][0] >= completed - 1, (_starts(nodes.out), _steps(nodes.out))
    _assert_trained_once_and_close(nodes.out, two_node_run)


def test_a_joining_node_receives_the_state(storage_path, tmp_path, two_node_run):
    """Two nodes train; a third joins: it gets the step the others are at from their
    memory, and the three go on from there."""
    with Nodes(tmp_path, storage_path, "join", "--nnodes", "2:3") as nodes:
        nodes.start(), nodes.start()
        _wait_for_step(nodes, 4, 2)
        nodes.start()
        codes = [p.wait(120) for p in nodes.procs]
    assert codes == [0, 0, 0], nodes.tails()
    [first, *later] = _starts(nodes.out)
    assert first == (0, 2) and later and later[-1][1] == 3, _starts(nodes.out)
    assert later[-1][0] >= 4, _starts(nodes.out)  # not the start of the run: no checkpoint
    _assert_trained_once_and_close(nodes.out, two_node_run)


def test_a_spare_takes_a_lost_nodes_place_with_the_survivors_state(storage_path, tmp_path,
                                                                   two_node_run):
    """``--nnodes 2 --spares 1``: the spare replaces a lost node at the same world size:
    bit-identical to the uninterrupted run."""
    with Nodes(tmp_path, storage_path, "spare", "--nnodes", 2, "--spares", 1,
               "--rdzv-conf", "keep_alive_interval=10") as nodes:
        nodes.start(), nodes.start()
        _wait_for_step(nodes, 2, 2)
        nodes.start()
        time.sleep(3)  # the spare parks in the rendezvous
        nodes.kill(1)
        codes = [nodes.procs[0].wait(120), nodes.procs[2].wait(60)]
    assert codes == [0, 0], nodes.tails()
    assert {w for _, w in _starts(nodes.out)} == {2}
    assert len(_starts(nodes.out)) >= 2 and _starts(nodes.out)[-1][0] > 0
    final = _assert_trained_once_and_close(nodes.out, two_node_run)
    for name, tensor in two_node_run["model"].items():
        assert torch.equal(final["model"][name], tensor), name
