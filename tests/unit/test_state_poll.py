"""state_poll: our agent's thread reads torch's rendezvous state more often while it
waits; any other thread keeps torch's pause."""

from __future__ import annotations

import threading
import time

import pytest
from torch.distributed.elastic.rendezvous import dynamic_rendezvous

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
