"""state_poll: our agent's thread reads torch's rendezvous state more often while it
waits; any other thread keeps torch's pause."""

from __future__ import annotations

import threading
import time

import pytest
import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousParameters, dynamic_rendezvous
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    RendezvousBackend,
    Token,
    create_handler,
)

from elastic_train.agent.rendezvous import state_poll


@pytest.mark.parametrize(("nodes", "expected"), [(1, 0.1), (16, 0.1), (80, 0.5), (160, 1.0),
                                                  (1024, 1.0)])
def test_the_pause_grows_with_the_job_to_torchs_second(nodes, expected):
    assert state_poll.interval_s(nodes) == pytest.approx(expected)


def test_only_the_thread_inside_polling_pauses_less(monkeypatch):
    with state_poll.polling(0.01):
        pass  # installed
    torchs: list = []
    monkeypatch.setattr(state_poll, "_torch_delay", torchs.append)
    other_done = threading.Event()
    inside = threading.Event()

    def other_thread() -> None:
        inside.wait(5)
        dynamic_rendezvous._delay(seconds=1)  # as torch's op executor calls it
        other_done.set()

    thread = threading.Thread(target=other_thread)
    thread.start()
    with state_poll.polling(0.02):
        inside.set()
        began = time.monotonic()
        dynamic_rendezvous._delay(seconds=1)
        paused = time.monotonic() - began
        dynamic_rendezvous._delay(seconds=(0, 0.3))  # the first round's jitter: torch's
        assert other_done.wait(5)
    thread.join(5)
    assert 0.02 <= paused < 0.5
    assert torchs == [1, (0, 0.3)]  # the other thread's pause, and the jitter
    dynamic_rendezvous._delay(seconds=1)  # outside again: torch's
    assert torchs == [1, (0, 0.3), 1]


class _CountingBackend(RendezvousBackend):
    """An in-memory rendezvous backend that counts the handler's reads."""

    def __init__(self) -> None:
        self.reads = 0
        self.state: tuple[bytes, Token] | None = None

    @property
    def name(self) -> str:
        return "counting"

    def get_state(self):
        self.reads += 1
        return self.state

    def set_state(self, state, token=None):
        self.state = (state, len(state))
        return state, len(state), True


def _reads_of_two_syncs(every_s: float | None) -> int:
    backend = _CountingBackend()
    handler = create_handler(dist.HashStore(), backend, RendezvousParameters(
        backend="counting", endpoint="", run_id="poll", min_nodes=1, max_nodes=2))
    if every_s is not None:
        state_poll.read_every(handler, every_s)
    handler.num_nodes_waiting()  # each call syncs the state holder
    time.sleep(0.15)
    handler.num_nodes_waiting()
    return backend.reads


@pytest.mark.compat  # torch's state holder and its cache, on every supported release
def test_the_handler_reads_its_state_as_often_as_it_polls():
    assert _reads_of_two_syncs(None) == 1  # torch's holder keeps a read for 1 s
    assert _reads_of_two_syncs(0.1) == 2

