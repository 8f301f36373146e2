"""DatasetShard and prepared loaders: disjoint, covering, reproducible, resumable per-rank
shares of each epoch."""

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from elastic_train.torch.train_loop_utils import prepared_loader
from elastic_train.worker.data_position import EpochPosition
from elastic_train.worker.dataset import DatasetShard

CPU = torch.device("cpu")


def dataset(n=23):
    x = torch.arange(n)
    return TensorDataset(x, x * 10)


def shard(ds=None, rank=0, world_size=1, seed=0):
    return DatasetShard(ds if ds is not None else dataset(), rank, world_size, CPU, lambda: seed)


def rows(s, **kwargs):
    """The ``x`` values of one epoch, in order."""
    batches = list(s.iter_torch_batches(batch_size=kwargs.pop("batch_size", 4), **kwargs))
    return torch.cat([b[0] for b in batches]).tolist() if batches else []


@pytest.mark.parametrize("n, world_size", [(23, 3), (24, 4), (5, 5), (7, 2)])
@pytest.mark.parametrize("shuffle", [True, False])
def test_shards_disjoint_and_cover_each_row_once(n, world_size, shuffle):
    ds = dataset(n)
    shards = [shard(ds, r, world_size) for r in range(world_size)]
    parts = [rows(s, shuffle=shuffle) for s in shards]
    assert [len(p) for p in parts] == [s.count() for s in shards]
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    seen = sorted(x for p in parts for x in p)
    assert seen == list(range(n))  # each row once: no padding, nothing dropped


def test_same_seed_and_epoch_same_order_new_epoch_new_order():
    a, b = shard(seed=7), shard(seed=7)
    first = rows(a)
    assert first == rows(b)
    assert rows(shard(seed=8)) != first
    second = rows(a)
    assert a.epoch == 2
    assert second != first and sorted(second) == sorted(first)
    assert rows(b) == second


def test_explicit_seed_overrides_default():
    assert rows(shard(seed=0), seed=5) == rows(shard(seed=5))


def test_no_shuffle_keeps_dataset_order():
    s = shard(dataset(10), rank=1, world_size=3)
    assert rows(s, shuffle=False) == [1, 4, 7]
    assert rows(s, shuffle=False) == [1, 4, 7]
    assert rows(shard(dataset(10), rank=0, world_size=3), shuffle=False) == [0, 3, 6, 9]
    assert rows(shard(dataset(10)), shuffle=False) == list(range(10))


def test_drop_last():
    s = shard(dataset(10))
    sizes = [len(b[0]) for b in s.iter_torch_batches(batch_size=4, shuffle=False)]
    assert sizes == [4, 4, 2]
    sizes = [len(b[0]) for b in s.iter_torch_batches(batch_size=4, drop_last=True)]
    assert sizes == [4, 4]
    assert s.epoch == 2


def test_dtypes_cast():
    s = shard(dataset(8))
    x, y = next(iter(s.iter_torch_batches(batch_size=4, dtypes=torch.float32)))
    assert x.dtype == y.dtype == torch.float32
    assert x.device == CPU


class DictDataset(Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        return {"x": torch.tensor([float(i)]), "y": torch.tensor(i)}


def test_per_key_dtypes_for_dict_batches():
    s = shard(DictDataset())
    batch = next(iter(s.iter_torch_batches(batch_size=3, dtypes={"x": torch.float16})))
    assert batch["x"].dtype == torch.float16
    assert batch["y"].dtype == torch.int64
    assert batch["x"].shape == (3, 1)


def test_collate_fn():
    s = shard(dataset(6))
    batches = list(s.iter_torch_batches(batch_size=4, shuffle=False,
                                        collate_fn=lambda items: len(items)))
    assert batches == [4, 2]


@pytest.mark.parametrize("k", [0, 1, 3, 6])
def test_state_dict_resumes_at_batch_k(k):
    ds = dataset(23)
    reference = shard(ds, rank=1, world_size=2, seed=3)
    rows(reference)  # epoch 0
    expected = list(reference.iter_torch_batches(batch_size=2))  # epoch 1: 6 batches

    interrupted = shard(ds, rank=1, world_size=2, seed=3)
    rows(interrupted)
    it = interrupted.iter_torch_batches(batch_size=2)
    for _ in range(k):
        next(it)
    state = interrupted.state_dict()
    assert (state["epoch"], state["batch"], state["taken"]) == (1, k, min(2 * k, 11))

    resumed = shard(ds, rank=1, world_size=2, seed=3)
    resumed.restore({0: {**state, "taken": 0}, 1: state})  # the same world: its own
    rest = list(resumed.iter_torch_batches(batch_size=2))
    assert len(rest) == len(expected) - k
    for got, want in zip(rest, expected[k:], strict=True):
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert position(resumed) == (2, 0)
    assert rows(resumed) == rows(reference)  # the next epoch matches too


def position(s):
    """(epoch, batch) of a shard's or loader's saved state."""
    state = s.state_dict()
    return state["epoch"], state["batch"]


def loader(n=12, rank=0, world=1, **kwargs):
    return prepared_loader(DataLoader(dataset(n), batch_size=4, **kwargs),
                           EpochPosition(rank, world), seed=0, device=None)


def test_prepared_loader_resumed_after_its_last_batch_has_an_empty_rest():
    """A checkpoint saved after an epoch's last batch (e.g. just in time) resumes into the
    empty rest of that epoch, so the loop's epoch and the loader's stay in step: a loop
    that reports after its epoch must not rely on a batch having run in it."""

    reference = loader()
    epochs = [[b[0].tolist() for b in reference] for _ in range(3)]
    interrupted = loader()
    list(interrupted)
    it = iter(interrupted)
    assert [next(it)[0].tolist() for _ in range(3)] == epochs[1]  # the loop's last step
    state = interrupted.state_dict()
    assert position(interrupted) == (1, 3)  # the pass has not ended: its last batch ran
    resumed = loader()
    resumed.restore({0: state})
    assert list(resumed) == []
    assert position(resumed) == (2, 0)
    assert [b[0].tolist() for b in resumed] == epochs[2]


def test_abandoned_iteration_starts_next_epoch():
    reference = shard(seed=1)
    epoch0, epoch1 = rows(reference), rows(reference)

    s = shard(seed=1)
    it = s.iter_torch_batches(batch_size=4)
    first = next(it)
    next(it)
    assert first[0].tolist() == epoch0[:4]
    assert position(s) == (0, 2)
    assert rows(s) == epoch1
    assert position(s) == (2, 0)


def test_abandoned_resumed_iteration_starts_next_epoch():
    reference = shard(seed=1)
    rows(reference)
    epoch1 = rows(reference)
    s = shard(seed=1)
    s.restore({0: {"epoch": 0, "batch": 1}})  # a state written before positions existed
    next(iter(s.iter_torch_batches(batch_size=4)))
    assert position(s) == (0, 2)
    assert rows(s) == epoch1


def test_rays_iter_torch_batches_arguments_port_unchanged():
    """A Ray script's prefetch/local-shuffle arguments work; local_shuffle_seed is the seed."""
    assert rows(shard(seed=0), prefetch_batches=2, local_shuffle_buffer_size=64,
                local_shuffle_seed=5) == rows(shard(seed=5))
    with pytest.raises(ValueError, match="prefetch_batches=-1"):
        rows(shard(), prefetch_batches=-1)


def test_prepared_loader_keeps_a_distributed_samplers_settings_and_set_epoch_works():
    from torch.utils.data import DistributedSampler

    ds = dataset(10)
    given = DistributedSampler(ds, num_replicas=2, rank=0, shuffle=True, seed=9)
    prepared = prepared_loader(DataLoader(ds, batch_size=2, sampler=given),
                               EpochPosition(0, 2), seed=0, device=None)
    assert isinstance(prepared.sampler, DistributedSampler)
    assert (prepared.sampler.shuffle, prepared.sampler.seed) == (True, 9)
    whole_epoch = list(prepared.sampler)
    first = [b[0].tolist() for b in prepared]
    assert whole_epoch == [x for b in first for x in b]
    prepared.sampler.set_epoch(0)  # the loop's own epoch: the same order again
    assert [b[0].tolist() for b in prepared] == first
    assert len(prepared) == 3 and len(prepared.sampler) == 5


def test_prepared_loader_of_an_iterable_dataset_is_left_as_it_is():
    from torch.utils.data import IterableDataset

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(6))

    prepared = prepared_loader(DataLoader(Stream(), batch_size=4), EpochPosition(0, 2),
                               seed=0, device=None)
    assert prepared.untracked and "IterableDataset" in prepared.untracked
    assert [b.tolist() for b in prepared] == [[0, 1, 2, 3], [4, 5]]


def test_prepare_data_loader_refuses_what_is_not_a_data_loader():
    from elastic_train.errors import ConfigError
    from elastic_train.torch import prepare_data_loader

    with pytest.raises(ConfigError, match=r"prepare_data_loader\(list\): pass a"):
        prepare_data_loader([1, 2, 3])


def test_an_untracked_loader_warns_at_a_world_size_change_and_starts_its_epoch_over(caplog):
    from torch.utils.data import IterableDataset

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(6))

    saved = {r: {"epoch": 2, "batch": 1, "untracked": "x"} for r in range(2)}
    same = prepared_loader(DataLoader(Stream(), batch_size=2), EpochPosition(0, 2), seed=0,
                           device=None)
    assert same.restore(saved) is None and not caplog.records
    assert [b.tolist() for b in same] == [[2, 3], [4, 5]]  # the same world: it skips one
    shrunk = prepared_loader(DataLoader(Stream(), batch_size=2), EpochPosition(0, 1),
                             seed=0, device=None)
    assert shrunk.restore(saved) is None  # nothing to say in restores.json: it is warned
    [warning] = caplog.records
    assert "cannot follow the world size change (2 -> 1 rank(s)): its dataset (Stream) " \
           "is an IterableDataset. Its epoch 2 starts over" in warning.getMessage()
    assert [b.tolist() for b in shrunk] == [[0, 1], [2, 3], [4, 5]]
    assert position(shrunk) == (3, 0)
