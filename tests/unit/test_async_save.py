"""elastic_train.torch.async_save's single-file path in this process (the sharded one
needs a process group: tests/e2e/test_fsdp.py): what it writes, the copy it blocks for,
the back-pressure rule, and its writer process dying with the process that owns it."""

from __future__ import annotations

import multiprocessing.resource_tracker
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future

import pytest
import torch

from elastic_train.errors import ConfigError
from elastic_train.torch import async_save, background_save
from tests.conftest import pid_alive, wait_until
from tests.support.paths import REPO
from tests.support.process_tree import descendants, thread_policies

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module", autouse=True)
def resource_tracker():
    """multiprocessing's tracker, which the first spawn starts and which stays for the
    life of this process, is running before any test counts its children."""
    multiprocessing.resource_tracker.ensure_running()


@pytest.fixture(autouse=True)
def fresh_saver(no_leaked_processes):
    """Each test starts its own writer; none outlives it."""
    yield
    if background_save._saver is not None:
        background_save._saver.close()
        background_save._saver = None


@pytest.mark.compat  # a second save with the same stager (torch 2.11's stages once)
def test_one_file_holds_the_state_as_it_was_when_the_call_returned():
    state = {"w": torch.arange(6.0), "step": 3, "nested": {"b": [torch.ones(2)]}}
    checkpoint = async_save(state, "model.pt")
    state["w"].add_(100)  # training goes on: the copy was taken
    checkpoint.written.result(timeout=60)
    assert os.listdir(checkpoint.path) == ["model.pt"]
    saved = torch.load(os.path.join(checkpoint.path, "model.pt"))
    assert torch.equal(saved["w"], torch.arange(6.0)) and saved["step"] == 3
    assert torch.equal(saved["nested"]["b"][0], torch.ones(2))
    again = async_save(state, "model.pt")  # the same buffers, copied again
    again.written.result(timeout=60)
    assert torch.equal(torch.load(os.path.join(again.path, "model.pt"))["w"], state["w"])


def test_the_writer_yields_the_cpu_to_training():
    async_save({"w": torch.zeros(3)}, "model.pt").written.result(timeout=60)
    writer = background_save._saver.files._process.pid
    assert thread_policies(writer) == {os.SCHED_IDLE}
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the training's own stays


def test_a_save_waits_for_the_write_before_it(monkeypatch):
    first = async_save({"w": torch.zeros(3)}, "model.pt")
    first.written.result(timeout=60)
    held: Future = Future()
    saver = background_save._saver
    monkeypatch.setattr(saver, "previous", held)  # a write still in flight
    returned = threading.Event()
    thread = threading.Thread(target=lambda: (async_save({"w": torch.ones(3)}, "model.pt"),
                                              returned.set()))
    thread.start()
    assert not returned.wait(0.5)  # blocked behind the write in flight
    held.set_result(None)
    assert returned.wait(30)
    thread.join()


@pytest.mark.parametrize("filename", ["", "a/model.pt", "/tmp/model.pt"])
def test_a_file_name_with_a_directory_is_refused(filename):
    with pytest.raises(ConfigError, match="file name without a directory"):
        async_save({"w": torch.zeros(1)}, filename)


def test_shards_need_a_process_group():
    with pytest.raises(ConfigError, match="needs torch.distributed"):
        async_save({"w": torch.zeros(1)})


def test_the_writer_dies_with_its_owner_in_the_middle_of_a_write():
    owner = subprocess.Popen([sys.executable, "-m", "tests.support.async_save_owner"],
                             cwd=REPO, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": REPO})
    try:
        line = owner.stdout.readline()
        assert line.startswith("WRITING "), line
        directory = line.split(" ", 1)[1].strip()
        helpers = descendants(owner.pid)  # the writer (and multiprocessing's tracker)
        assert helpers
        time.sleep(0.5)
        assert all(map(pid_alive, helpers))  # busy for 120 s: only the watch ends it sooner
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    assert wait_until(lambda: not any(map(pid_alive, helpers)), 10), helpers
    assert os.listdir(directory) == ["second.pt"]  # half written, in a directory never reported
