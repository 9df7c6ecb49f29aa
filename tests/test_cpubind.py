"""Each CPU rank's slice of a shared CPU set, and when the set is left alone."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcdist.cpubind import bind_cpu_rank, describe, rank_cpus


def test_four_ranks_of_sixteen_threads_split_sixty_four_cpus_in_blocks() -> None:
    cpus = list(range(64))
    assert [rank_cpus(cpus, r, 4, 16) for r in range(4)] == [
        tuple(range(16 * r, 16 * r + 16)) for r in range(4)
    ]


def test_the_slice_is_of_the_sorted_set_not_of_cpu_numbers() -> None:
    allowed = [9, 3, 5, 7, 11, 13]  # e.g. a cgroup of odd CPUs, in any order
    assert rank_cpus(allowed, 0, 2, 3) == (3, 5, 7)
    assert rank_cpus(allowed, 1, 2, 3) == (9, 11, 13)


def test_a_set_just_large_enough_is_split_and_one_cpu_less_is_left_alone() -> None:
    assert rank_cpus(range(8), 1, 2, 4) == (4, 5, 6, 7)
    assert rank_cpus(range(7), 1, 2, 4) is None  # srun bound it already, or too small


def test_one_local_rank_or_no_thread_count_leaves_the_set_alone() -> None:
    assert rank_cpus(range(64), 0, 1, 16) is None
    assert rank_cpus(range(64), 0, 2, None) is None
    assert rank_cpus(range(64), 0, 2, 0) is None
    assert rank_cpus(range(64), 0, 2, 1) == (0,)


@pytest.mark.parametrize("local_rank", [-1, 2])
def test_a_local_rank_outside_the_world_is_an_error(local_rank: int) -> None:
    with pytest.raises(ValueError, match=f"local rank {local_rank} is outside 0..1"):
        rank_cpus(range(8), local_rank, 2, 2)


@given(
    n=st.integers(1, 256),
    world=st.integers(2, 16),
    threads=st.integers(1, 32),
)
def test_slices_never_overlap_and_stay_inside_the_set(n: int, world: int, threads: int) -> None:
    allowed = list(range(0, 2 * n, 2))
    slices = [rank_cpus(allowed, r, world, threads) for r in range(world)]
    if n < world * threads:
        assert slices == [None] * world
        return
    taken = [cpu for cpus in slices for cpu in (cpus or ())]
    assert len(taken) == len(set(taken)) == world * threads
    assert set(taken) <= set(allowed)


def test_slurms_own_binding_choice_is_respected() -> None:
    before = os.sched_getaffinity(0)
    assert bind_cpu_rank(0, 2, 1, {"SLURM_CPU_BIND_TYPE": "none"}) is None
    assert os.sched_getaffinity(0) == before


def test_describe_folds_runs() -> None:
    assert describe([0, 1, 2, 3]) == "0-3"
    assert describe([5, 0, 2, 1]) == "0-2,5"
    assert describe([7]) == "7"
    assert describe([]) == ""
