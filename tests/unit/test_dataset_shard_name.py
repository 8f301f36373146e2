"""get_dataset_shard(dataset_name=None), Ray's signature: the only dataset, or a KeyError
that lists the names (the tracking e2e test reads a shard this way in real workers)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from elastic_train.worker.session import TrainSession


def session_with(datasets: dict) -> TrainSession:
    session = TrainSession.__new__(TrainSession)  # the shard logic only, no process group
    session.spec = SimpleNamespace(datasets=datasets)
    session.env = SimpleNamespace(rank=1, world_size=2)
    session.resources = SimpleNamespace(devices=[torch.device("cpu")])
    session.seed, session._synced, session._shards, session._resumables = 0, None, {}, {}
    session._live_positions = None  # no live recovery
    session._joined = SimpleNamespace(restored=None)  # as if the ranks agreed on a fresh start
    return session


def test_without_a_name_the_only_dataset():
    session = session_with({"train": list(range(8))})
    shard = session.get_dataset_shard()
    assert shard is session.get_dataset_shard(dataset_name="train") and shard.count() == 4


def test_without_a_name_and_several_datasets_the_error_lists_them():
    with pytest.raises(KeyError, match=r"exactly one dataset.*\['train', 'val'\]"):
        session_with({"train": [1, 2], "val": [3, 4]}).get_dataset_shard()
