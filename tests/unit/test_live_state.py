"""Unit tests of live recovery's parts: copies into kept buffers, what a held state reads
when, every rank's data position from one rank's, an abort held back inside a step, and
LiveState's checks of what it is given."""

from __future__ import annotations

import signal

import pytest
import torch

from elastic_train.errors import ConfigError
from elastic_train.torch import LiveState
from elastic_train.torch.live_state import _ModuleKeeper, _OptimizerKeeper
from elastic_train.worker.data_position import EpochPosition, every_rank
from elastic_train.worker.inprocess import loop
from elastic_train.worker.live.held import Held, copy_tree, freeze_all, get, keep, nbytes, tensors


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


def test_a_held_state_reads_parameters_at_the_end_and_copies_buffers_each_step():
    """The optimizer's step changes parameters (read when the attempt ends, no copy per
    step); batch norm's statistics change in the forward pass (copied at step_done)."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    keeper = _ModuleKeeper(model)
    model(torch.randn(4, 3))
    keeper.copy()  # step_done
    at_step = model[1].running_mean.clone()
    model(torch.randn(4, 3))  # the next step's forward pass, then the attempt fails
    with torch.no_grad():
        model[0].weight.add_(1.0)  # (no optimizer: a step that completed)
    entry = Held(keepers={"model": keeper}, step=3)
    keep("unit", entry)
    freeze_all()
    frozen = get("unit").frozen["model"]
    assert torch.equal(frozen["1.running_mean"], at_step)  # the copy of the step
    assert torch.equal(frozen["0.weight"], model[0].weight)  # read at the end
    assert not entry.keepers  # the objects are let go


def test_an_attempt_that_ended_inside_a_step_holds_nothing():
    keep("unit", Held(keepers={"model": _ModuleKeeper(torch.nn.Linear(1, 1))}, open=True))
    freeze_all()
    assert get("unit") is None


def test_an_optimizers_settings_are_those_of_the_last_step():
    """A scheduler stepped after the last step_done() changed the learning rate: the held
    state has the step's."""
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.1)
    keeper = _OptimizerKeeper(optimizer)
    optimizer.step()
    keeper.copy()  # step_done
    scheduler.step()
    assert keeper.full_state()["param_groups"][0]["lr"] == 0.5


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


def test_an_abort_inside_a_step_waits_for_its_end(monkeypatch):
    monkeypatch.setattr(loop, "_in_attempt", True)
    loop.hold_aborts()  # the optimizer steps
    loop._on_abort(signal.SIGUSR1, None)  # another rank failed, mid-step: nothing yet
    with pytest.raises(loop.RestartAttempt):
        loop.release_aborts()  # step_done()
    assert not loop._deferred and not loop._deferring
    with pytest.raises(loop.RestartAttempt):  # outside a step an abort raises at once
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
