"""Unit tests of live recovery's parts: the held copy, every rank's data position from one
rank's, an abort held back during a copy, and LiveState's checks of what it is given."""

from __future__ import annotations

import signal

import pytest
import torch

from elastic_train.errors import ConfigError
from elastic_train.torch import LiveState
from elastic_train.worker.data_position import EpochPosition, every_rank
from elastic_train.worker.inprocess import loop
from elastic_train.worker.live.held import Held, copy_tree, nbytes, tensors


def test_a_copy_reuses_the_previous_buffers_and_shares_nothing_with_its_source():
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 3}
    first = copy_tree(state)
    buffers = [t.data_ptr() for t in tensors(first)]
    with torch.no_grad():
        model.weight.add_(1.0)
    second = copy_tree({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "epoch": 4}, into=first)
    assert [t.data_ptr() for t in tensors(second)] == buffers  # no allocation
    assert torch.equal(second["model"]["weight"], model.weight)
    with torch.no_grad():
        model.weight.add_(1.0)
    assert not torch.equal(second["model"]["weight"], model.weight)  # a copy, not a view
    assert second["epoch"] == 4 and second["optimizer"]["param_groups"][0]["params"] == [0, 1]
    assert nbytes(second) == (8 + 2) * 4 * 2  # the weights and their momentum


def test_a_copy_of_another_shape_allocates_anew():
    first = copy_tree({"w": torch.zeros(2)})
    second = copy_tree({"w": torch.ones(3)}, into=first)
    assert second["w"].tolist() == [1.0, 1.0, 1.0] and first["w"].tolist() == [0.0, 0.0]


def test_held_takes_a_copy_with_its_step_and_positions():
    held = Held.take(7, {"w": torch.ones(2)}, {"loader:0": {"batch": 3}}, 2, 4, None)
    assert (held.step, held.iteration, held.world, held.positions) == \
        (7, 2, 4, {"loader:0": {"batch": 3}})
    assert held.taken_at > 0


@pytest.mark.parametrize("world,batches", [(2, 3), (3, 4), (4, 2)])
def test_every_ranks_position_follows_from_one_ranks(world, batches):
    """Ranks in step (the same batches handed out) differ only in what they took: each
    rank's state computed from rank 0's equals the one that rank kept."""
    kept = []
    for rank in range(world):
        position = EpochPosition(rank, world)
        position.begin_pass()
        for batch in position.batches(n=50, batch_size=4, accumulation=2)[:batches]:
            position.took(batch)
        kept.append(position.state_dict())
    for source in range(world):
        assert every_rank(kept[source]) == dict(enumerate(kept))


def test_a_position_before_any_pass_is_the_same_on_every_rank():
    state = EpochPosition(0, 3).state_dict()
    assert every_rank(state) == {0: state, 1: state, 2: state}


def test_an_abort_during_a_copy_waits_for_its_end(monkeypatch):
    monkeypatch.setattr(loop, "_in_attempt", True)
    done = []
    with pytest.raises(loop.RestartAttempt):
        with loop.abort_deferred():
            loop._on_abort(signal.SIGUSR1, None)  # another rank failed, mid-copy
            done.append("the copy ends")
    assert done == ["the copy ends"] and not loop._deferred


def test_the_blocks_own_error_wins_over_a_held_abort(monkeypatch):
    monkeypatch.setattr(loop, "_in_attempt", True)
    with pytest.raises(ValueError):
        with loop.abort_deferred():
            loop._on_abort(signal.SIGUSR1, None)
            raise ValueError("the user's state_dict failed")
    assert not loop._deferred and not loop._deferring
    with pytest.raises(loop.RestartAttempt):  # outside the block an abort raises at once
        loop._on_abort(signal.SIGUSR1, None)


@pytest.mark.parametrize("kwargs,words", [
    ({}, "keeps nothing"),
    ({"name": "", "model": torch.nn.Linear(1, 1)}, "name=''"),
    ({"loader": iter([1])}, "loader=<list_iterator>"),
    ({"epoch": object()}, "epoch=<object>"),
    ({"extra": {1: 2}}, "extra=<dict>"),
])
def test_what_live_state_cannot_keep_is_refused_by_name(kwargs, words):
    with pytest.raises(ConfigError, match="LiveState") as error:
        LiveState(**kwargs)
    assert words in str(error.value)
