"""Elastic data positions: any sequence of world sizes trains on each sample of an epoch
once; the same world size resumes exactly where it stopped."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_train.worker.data_position import (
    Done,
    EpochPosition,
    batch_sizes,
    merge,
    plan,
    share,
)


def run_epoch(n: int, batch_size: int, phases: list[tuple[int, int]], even: bool = False,
              drop_last: bool = False) -> tuple[list[list[list[int]]], list[int]]:
    """One epoch of ``n`` samples over ``phases`` of (world size, steps run before the
    world changes), every rank checkpointing and resuming at each change. Returns each
    phase's batches per rank, and each place's count of non-padding visits."""
    visits = [0] * n
    states: dict[int, dict] = {}
    batches_by_phase = []
    for world, steps in phases:
        positions = [EpochPosition(rank, world) for rank in range(world)]
        for p in positions:
            p.restore(states)
            p.begin_pass()
        plans = [p.batches(n, batch_size, drop_last, even) for p in positions]
        shares = [set(share(p.done.rest(n), world, p.rank).tolist()) for p in positions]
        assert len({len(b) for b in plans}) <= 1  # every rank runs as many steps
        for p, batches, mine in zip(positions, plans, shares, strict=True):
            for places in batches[:steps]:
                p.took(places)
                for place in places.tolist():
                    visits[place] += place in mine
        batches_by_phase.append([[b.tolist() for b in batches[:steps]] for batches in plans])
        states = {p.rank: p.state_dict() for p in positions}
    return batches_by_phase, visits


phases = st.lists(st.tuples(st.integers(1, 5), st.integers(0, 6)), min_size=1, max_size=5)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 60), batch_size=st.integers(1, 5), phases=phases)
def test_any_sequence_of_world_sizes_visits_each_sample_at_most_once(n, batch_size, phases):
    *_, last = phases
    _, visits = run_epoch(n, batch_size, [*phases, (last[0], 10**6)])
    assert visits == [1] * n  # the last phase runs to the epoch's end: every sample once


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 60), batch_size=st.integers(1, 5), phases=phases)
def test_drop_last_visits_each_sample_at_most_once(n, batch_size, phases):
    _, visits = run_epoch(n, batch_size, phases, drop_last=True)
    assert set(visits) <= {0, 1}


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 60), batch_size=st.integers(1, 5), world=st.integers(1, 5),
       cut=st.integers(0, 20))
def test_the_same_world_size_resumes_bit_identically(n, batch_size, world, cut):
    [whole] = run_epoch(n, batch_size, [(world, 10**6)])[0]
    first, rest = run_epoch(n, batch_size, [(world, cut), (world, 10**6)])[0]
    assert [a + b for a, b in zip(first, rest, strict=True)] == whole


def test_a_shrink_splits_the_rest_and_is_deterministic():
    phases = [(2, 3), (1, 10**6)]
    once, visits = run_epoch(48, 4, phases)
    assert visits == [1] * 48
    assert once == run_epoch(48, 4, phases)[0]
    [[first_rank0, first_rank1], [alone]] = once
    assert sum(map(len, alone)) == 48 - 24  # 3 steps of 2 ranks x 4 samples were done


def test_even_pads_like_torch_and_padding_is_not_counted():
    _, visits = run_epoch(5, 2, [(2, 10**6)], even=True)
    assert visits == [1] * 5
    rank1 = plan(Done(), 5, 2, 1, 2, even=True)
    assert [len(b) for b in rank1] == [2, 1]  # its 2 samples, then a repeat of the first
    assert rank1[1].tolist() == [0]


def test_batches_are_full_first_and_never_empty_while_samples_last():
    assert batch_sizes(17, 3, 8) == [8, 8, 1]
    assert batch_sizes(16, 3, 8) == [8, 7, 1]
    assert batch_sizes(2, 3, 8) == [1, 1, 0]


def test_merge_turns_uneven_shares_into_a_prefix_and_the_places_beyond():
    done = merge(Done(), 10, 3, {0: 2, 1: 1, 2: 2})  # places 0,3 | 1 | 2,5
    assert done == Done(4, (5,))
    assert done.rest(10).tolist() == [4, 6, 7, 8, 9]


def test_a_resume_at_90_percent_of_a_large_epoch_reads_nothing_before_it():
    n = 1_000_000
    states = {r: {"epoch": 0, "batch": 0, "taken": 450_000, "prefix": 0, "beyond": [],
                  "world": 2, "size": n} for r in range(2)}
    position = EpochPosition(0, 3)
    position.restore(states)
    position.begin_pass()
    batches = position.batches(n, 32)
    assert position.done == Done(900_000)
    assert sum(map(len, batches)) == torch.arange(900_000, n)[0::3].numel()
