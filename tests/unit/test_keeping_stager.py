"""KeepingStager: the first save is staged by DCP's DefaultStager, the next ones of the
same layout are copied into what it staged; any other layout is staged anew."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from elastic_train.torch.keeping_stager import KeepingStager


def _stager() -> KeepingStager:
    return KeepingStager(shared_memory=True, pin_memory=False)


def _state(value: float, lr: float = 0.1) -> dict:
    return {"model": OrderedDict(w=torch.full((4, 3), value), b=torch.full((3,), value)),
            "optim": {"param_groups": [{"lr": lr, "params": ["w", "b"]}],
                      "state": {"w": {"step": torch.tensor(value), "exp": (torch.ones(2),)}}}}


def _staged_tensors(staged) -> list[torch.Tensor]:
    return [staged["model"]["w"], staged["model"]["b"], staged["optim"]["state"]["w"]["step"]]


def _assert_equal(staged, state) -> None:
    assert type(staged["model"]) is OrderedDict
    assert staged["optim"]["param_groups"] == state["optim"]["param_groups"]
    for mine, theirs in zip(_staged_tensors(staged), _staged_tensors(state), strict=True):
        assert torch.equal(mine, theirs)
    assert torch.equal(staged["optim"]["state"]["w"]["exp"][0], torch.ones(2))


@pytest.mark.compat  # torch 2.11's DefaultStager stages once: the second save must not ask it
def test_a_save_of_the_same_layout_copies_into_the_first_ones_buffers():
    stager = _stager()
    first_state, second_state = _state(1.0), _state(2.0, lr=0.05)
    first = stager.stage(first_state)
    buffers = [t.untyped_storage().data_ptr() for t in _staged_tensors(first)]
    _assert_equal(first, first_state)
    assert all(t.is_shared() for t in _staged_tensors(first))
    second = stager.stage(second_state)
    _assert_equal(second, second_state)  # new values, the changed lr included
    assert [t.untyped_storage().data_ptr() for t in _staged_tensors(second)] == buffers
    # The first staged state keeps its own containers (a writer may still hold them).
    assert first["optim"]["param_groups"][0]["lr"] == 0.1 and first is not second
    second_state["model"]["w"].add_(5)  # training goes on: the copy was taken
    assert torch.equal(second["model"]["w"], torch.full((4, 3), 2.0))
    stager.close()


@pytest.mark.parametrize("change", ["key", "shape", "dtype", "container"])
def test_a_save_of_another_layout_is_staged_anew(change):
    stager = _stager()
    stager.stage(_state(1.0))
    state = _state(3.0)
    if change == "key":
        state["model"]["extra"] = torch.zeros(2)
    elif change == "shape":
        state["model"]["w"] = torch.full((5, 3), 3.0)
    elif change == "dtype":
        state["model"]["b"] = torch.full((3,), 3, dtype=torch.int64)
    else:
        state["model"] = dict(state["model"])
    staged = stager.stage(state)
    assert type(staged["model"]) is type(state["model"])
    for key, tensor in state["model"].items():
        assert torch.equal(staged["model"][key], tensor) and staged["model"][key].is_shared()
    stager.close()


@dataclass
class _Meta:
    epoch: int


def test_an_object_it_does_not_know_is_left_to_defaultstager():
    stager = _stager()
    stager.stage({"w": torch.ones(2), "meta": _Meta(1)})
    staged = stager.stage({"w": torch.zeros(2), "meta": _Meta(2)})
    assert staged["meta"] == _Meta(2) and torch.equal(staged["w"], torch.zeros(2))
    stager.close()


@pytest.fixture
def mesh():
    """A device mesh of this process alone (gloo), for DTensors."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def test_dtensors_are_copied_shard_into_staged_shard(mesh):
    stager = _stager()
    first = stager.stage({"w": distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)])})
    buffer = first["w"].to_local().untyped_storage().data_ptr()
    second = stager.stage({"w": distribute_tensor(torch.full((4, 2), 7.0), mesh, [Shard(0)])})
    assert second["w"].placements == (Shard(0),)
    assert torch.equal(second["w"].to_local(), torch.full((4, 2), 7.0))
    assert second["w"].to_local().untyped_storage().data_ptr() == buffer
    replicated = stager.stage({"w": distribute_tensor(torch.zeros(4, 2), mesh, [Replicate()])})
    assert replicated["w"].placements == (Replicate(),)  # another placement: staged anew
    assert torch.equal(replicated["w"].to_local(), torch.zeros(4, 2))
    stager.close()
