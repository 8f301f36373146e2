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


@pytest.mark.parametrize("k", [0, 1, 3, 5])
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


def test_prepared_loader_resumed_after_its_last_batch_goes_on_with_the_next_epoch():
    """A pass whose every batch was handed out is finished, whether or not its iterator
    was asked for its end (``zip(range(len(c)), c)`` never asks): a resume from a
    checkpoint saved then goes on with the next epoch, as after a checkpoint saved after
    the loop (``epoch + 1``); ``set_epoch`` of the finished epoch gives its empty rest."""
    reference = loader()
    epochs = [[b[0].tolist() for b in reference] for _ in range(3)]
    interrupted = loader()
    list(interrupted)
    paired = zip(range(len(interrupted)), interrupted, strict=False)  # never asks the end
    assert [x[0].tolist() for _, x in paired] == epochs[1]
    state = interrupted.state_dict()
    assert (*position(interrupted), state["finished"]) == (1, 3, True)
    resumed = loader()
    resumed.restore({0: state})
    assert [b[0].tolist() for b in resumed] == epochs[2]
    in_the_saved_epoch = loader()
    in_the_saved_epoch.restore({0: state})
    in_the_saved_epoch.sampler.set_epoch(1)  # a loop that resumes in the epoch it saved
    assert list(in_the_saved_epoch) == []
    assert [b[0].tolist() for b in in_the_saved_epoch] == epochs[2]


def test_a_shard_resumed_after_its_last_batch_goes_on_with_the_next_epoch():
    reference = shard(seed=2)
    rows(reference)
    epoch1 = rows(reference)
    interrupted = shard(seed=2)
    it = interrupted.iter_torch_batches(batch_size=4)
    [next(it) for _ in range(6)]  # all of epoch 0's 23 rows, the end never asked for
    resumed = shard(seed=2)
    resumed.restore({0: interrupted.state_dict()})
    assert rows(resumed) == epoch1


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


def test_a_loader_of_batch_size_none_is_split_across_ranks_and_tracked():
    """``DataLoader(batch_size=None)`` hands out each item as it is: each rank gets its
    share of the items (as Ray gives it a DistributedSampler), and a resume at another
    world size trains on the rest of the epoch, each item once."""
    ds = dataset(10)
    ranks = [prepared_loader(DataLoader(ds, batch_size=None), EpochPosition(r, 2), seed=0,
                             device=None) for r in range(2)]
    assert all(p.untracked is None for p in ranks)
    items = [[int(x) for x, _ in p] for p in ranks]
    assert sorted(items[0] + items[1]) == list(range(10)) and len(items[0]) == 5
    iterators = [iter(p) for p in ranks]
    taken = [int(next(it)[0]) for it in iterators for _ in range(2)]  # 2 items each
    alone = prepared_loader(DataLoader(ds, batch_size=None), EpochPosition(0, 1), seed=0,
                            device=None)
    resumed = alone.restore({r: p.state_dict() for r, p in enumerate(ranks)})
    assert (resumed.done, resumed.total) == (4, 10)
    assert sorted(taken + [int(x) for x, _ in alone]) == list(range(10))


def _every_argument_set() -> dict:
    """A value for every argument of torch's DataLoader, none its default."""
    import inspect
    import multiprocessing

    from torch.utils.data import DataLoader, default_collate

    values = {"dataset": dataset(8), "batch_size": 2, "shuffle": True, "num_workers": 1,
              "collate_fn": default_collate, "pin_memory": True, "drop_last": True,
              "timeout": 5.0, "worker_init_fn": print,
              "multiprocessing_context": multiprocessing.get_context("spawn"),
              "generator": torch.Generator().manual_seed(3), "prefetch_factor": 8,
              "persistent_workers": True, "pin_memory_device": "cpu", "in_order": False}
    unset = set(inspect.signature(DataLoader.__init__).parameters) - {
        "self", "sampler", "batch_sampler"} - set(values)
    assert not unset, f"torch's DataLoader has new arguments: give them a value here: {unset}"
    return values


def test_a_prepared_loader_keeps_every_argument_of_torchs_data_loader():
    """Read from DataLoader's signature, so an argument a newer torch adds fails here until
    prepare_data_loader carries it (the ones it sets itself: the data's split)."""
    import inspect
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pin_memory without a GPU
        given = DataLoader(**_every_argument_set())
        prepared = prepared_loader(given, EpochPosition(0, 1), seed=0, device=None)
    for name in inspect.signature(DataLoader.__init__).parameters:
        if name not in {"self", "dataset", "batch_size", "shuffle", "sampler", "batch_sampler",
                        "drop_last"}:
            assert getattr(prepared.loader, name) == getattr(given, name), name
    assert prepared.sampler.drop_last and prepared.sampler.batch_size == 2


@pytest.mark.parametrize("value, said", [
    (0, "pass a positive number"), (-64, "pass a positive number"),
    ("64", "a str; pass an int"), (64.0, "a float; pass an int"), (True, "a bool; pass")])
def test_a_global_batch_size_that_is_not_a_positive_int_is_refused_by_name(value, said):
    from elastic_train.errors import ConfigError
    from elastic_train.torch import prepare_data_loader

    with pytest.raises(ConfigError, match=rf"global_batch_size={value!r}\): {said}"):
        prepare_data_loader(DataLoader(dataset(8), batch_size=2), global_batch_size=value)


def test_a_global_batch_with_batch_size_none_names_batch_size_none():
    from elastic_train.errors import ConfigError

    with pytest.raises(ConfigError, match=r"but it has batch_size=None: .* give it a "
                                          "batch_size"):
        prepared_loader(DataLoader(dataset(8), batch_size=None), EpochPosition(0, 1),
                        seed=0, device=None, global_batch_size=4)


@pytest.mark.parametrize("global_batch, said", [
    (64, r"step of 64 \(global_batch_size=64\)"), (None, r"step of 64 \(batch_size=64 on 1")])
def test_drop_last_over_fewer_samples_than_one_step_is_refused(global_batch, said):
    from elastic_train.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"its 40 samples are fewer than one {said}.*"
                                          "every epoch would be empty"):
        prepared_loader(DataLoader(dataset(40), batch_size=64, drop_last=True),
                        EpochPosition(0, 1), seed=0, device=None,
                        global_batch_size=global_batch)


def test_preparing_a_prepared_loader_again_returns_it_unless_the_arguments_differ(
        monkeypatch):
    from elastic_train.errors import ConfigError
    from elastic_train.torch import train_loop_utils

    class Session:  # what prepare_data_loader asks of a session
        seed = 0
        registered: list = []

        def next_loader_key(self):
            return f"loader:{len(self.registered)}"

        def register_resumable(self, key, resumable):
            self.registered.append(key)

    monkeypatch.setattr(train_loop_utils, "get_session", Session)
    once = train_loop_utils.prepare_data_loader(DataLoader(dataset(8), batch_size=2),
                                                move_to_device=False)
    assert train_loop_utils.prepare_data_loader(once, move_to_device=False) is once
    assert Session.registered == ["loader:0"]
    with pytest.raises(ConfigError, match=r"prepare_data_loader\(loader, global_batch_size=4 "
                                          r"\(prepared with None\)\): this loader was "
                                          "already prepared"):
        train_loop_utils.prepare_data_loader(once, move_to_device=False, global_batch_size=4)


def test_a_shards_batch_size_must_be_a_positive_int():
    from elastic_train.errors import ConfigError

    for value in (0, -1, 2.0, "8"):
        with pytest.raises(ConfigError, match=rf"iter_torch_batches\(batch_size={value!r}\)"):
            rows(shard(), batch_size=value)


def test_ray_datas_iter_batches_points_to_iter_torch_batches():
    with pytest.raises(AttributeError, match=r"no iter_batches\(\) \(Ray Data's name\): "
                                             r"use iter_torch_batches\(batch_size=...\)"):
        shard().iter_batches(batch_size=8)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        shard().nope  # noqa: B018
