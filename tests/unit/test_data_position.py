"""Elastic data positions: any sequence of world sizes trains on each sample of an epoch
once; the same world size resumes exactly where it stopped."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_train.errors import ConfigError
from elastic_train.worker.data_position import (
    Done,
    EpochPosition,
    accumulation_for,
    check_global_batch,
    merge,
    plan,
)


def run_epoch(n: int, batch_size: int, phases: list[tuple[int, int]], even: bool = False,
              drop_last: bool = False, accumulation: int = 1
              ) -> tuple[list[list[list[int]]], list[int]]:
    """One epoch of ``n`` samples over ``phases`` of (world size, batches run before the
    world changes), every rank checkpointing and resuming at each change. Returns each
    phase's batches per rank, and each place's count of non-padding visits. A phase after
    one that took the epoch's last batch runs nothing: the epoch is finished (a resume
    goes on with the next one)."""
    visits = [0] * n
    states: dict[int, dict] = {}
    batches_by_phase = []
    for world, steps in phases:
        if states and states[0]["finished"]:
            batches_by_phase.append([[] for _ in range(world)])
            continue
        positions = [EpochPosition(rank, world) for rank in range(world)]
        for p in positions:
            p.restore(states)
            p.begin_pass()
        plans = [p.batches(n, batch_size, drop_last, even, accumulation) for p in positions]
        assert len({len(b) for b in plans}) <= 1  # every rank runs as many batches
        for p, batches in zip(positions, plans, strict=True):
            for batch in batches[:steps]:
                p.took(batch)
                for place in batch.places[: batch.real].tolist():
                    visits[place] += 1
        batches_by_phase.append([[b.places.tolist() for b in batches[:steps]]
                                 for batches in plans])
        states = {p.rank: p.state_dict() for p in positions}
    return batches_by_phase, visits


phases = st.lists(st.tuples(st.integers(1, 5), st.integers(0, 6)), min_size=1, max_size=5)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 60), batch_size=st.integers(1, 5), phases=phases,
       accumulation=st.integers(1, 3))
def test_any_sequence_of_world_sizes_visits_each_sample_once(n, batch_size, phases,
                                                             accumulation):
    *_, last = phases
    _, visits = run_epoch(n, batch_size, [*phases, (last[0], 10**6)],
                          accumulation=accumulation)
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
    assert [b.places.tolist() for b in rank1] == [[1, 3], [0]]  # step 2: [4] + a repeat
    assert [b.real for b in plan(Done(), 5, 2, 1, 2)] == [2, 0]  # it has none: padding
    assert plan(Done(), 5, 2, 1, 2)[1].loss_scale(2) == 0.0


def test_a_global_batch_step_holds_the_same_samples_at_any_world_size():
    """Step k of a pass takes the same places whatever the world size and accumulation:
    the optimizer sees the same global batches after a shrink."""
    def steps(world, accumulation, batch_size):
        by_rank = [plan(Done(16), 64, world, r, batch_size, accumulation=accumulation)
                   for r in range(world)]
        per_step = []
        for k in range(len(by_rank[0]) // accumulation):
            micro = [b for rank in by_rank for b in rank[k * accumulation:
                                                         (k + 1) * accumulation]]
            per_step.append(sorted(p for b in micro for p in b.places.tolist()))
        return per_step

    assert steps(4, 1, 4) == steps(2, 2, 4) == steps(1, 4, 4) == steps(1, 2, 8)
    assert steps(4, 1, 4)[0] == list(range(16, 32))


def test_loss_scales_weigh_every_sample_of_a_step_alike():
    """Uneven micro-batches in the last step: scale / batch length is the same for all."""
    batches = [b for r in range(3) for b in plan(Done(), 10, 3, r, 2, accumulation=2)]
    assert sorted(b.real for b in batches) == [1, 1, 2, 2, 2, 2]  # one step of 10
    # a sample's gradient weight: DDP's 1/world x the scale x its micro-batch's mean
    weights = {round(b.loss_scale(3) / 3 / b.real, 12) for b in batches}
    assert weights == {round(1 / 10, 12)}


@pytest.mark.parametrize("global_batch, world, batch_size, expected", [
    (32, 2, 8, (2, 8)), (32, 1, 8, (4, 8)), (32, 4, 8, (1, 8)), (24, 2, 8, (2, 6)),
    (30, 3, 4, (5, 2)),
])
def test_accumulation_keeps_the_global_batch(global_batch, world, batch_size, expected):
    steps, micro = accumulation_for(global_batch, world, batch_size)
    assert (steps, micro) == expected and steps * micro * world == global_batch


def test_a_global_batch_that_does_not_divide_by_the_world_size_is_refused():
    with pytest.raises(ConfigError, match=r"global_batch_size=32\) cannot be split over 3 "
                                          r"workers \(this job may run at 3\): use a "
                                          r"multiple .* \(e.g. 96\)"):
        accumulation_for(32, 3, 8)


def test_a_global_batch_is_checked_against_every_world_size_the_job_may_run_at():
    """``--nnodes 1:2`` of 3 workers each: a global batch of 3 divides at world 3, not at
    6, the world a joining node would make: refused at the first."""
    check_global_batch(6, [3, 6])
    with pytest.raises(ConfigError, match=r"global_batch_size=3\) cannot be split over 6 "
                                          r"workers \(this job may run at 3, 6\): .* "
                                          r"\(e.g. 6\)"):
        check_global_batch(3, [3, 6])


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
    assert sum(len(b.places) for b in batches) == torch.arange(900_000, n)[0::3].numel()


def _after_the_last_batch(world: int = 1) -> dict[int, dict]:
    """Each rank's state once it took its pass's last batch, its iterator never asked
    for the end (``zip(range(len(c)), c)``)."""
    positions = [EpochPosition(rank, world) for rank in range(world)]
    for p in positions:
        p.begin_pass()
        for batch in p.batches(10, 2):
            p.took(batch)
    return {p.rank: p.state_dict() for p in positions}


@pytest.mark.parametrize("saved_world, world", [(1, 1), (2, 1), (1, 2)])
def test_a_pass_whose_every_batch_was_taken_is_finished_and_a_resume_starts_the_next_epoch(
        saved_world, world):
    states = _after_the_last_batch(saved_world)
    assert all(s["finished"] and s["epoch"] == 0 for s in states.values())
    resumed = EpochPosition(0, world)
    resumed.restore(states)
    resumed.begin_pass()
    assert resumed.epoch == 1
    assert [b.places.tolist() for b in resumed.batches(10, 2)] == \
        [b.places.tolist() for b in plan(Done(), 10, world, 0, 2)]


def test_set_epoch_of_the_finished_epoch_gives_its_empty_rest():
    """A loop that resumes in the epoch it saved inside the batch loop, and says so with
    ``set_epoch``, gets that epoch's (empty) rest, then the next epoch."""
    resumed = EpochPosition(0, 1)
    resumed.restore(_after_the_last_batch())
    resumed.set_epoch(0)
    resumed.begin_pass()
    assert (resumed.epoch, resumed.batches(10, 2)) == (0, [])
    resumed.end_pass()
    assert resumed.epoch == 1
