"""Each CPU rank's slice of a shared CPU set, and when the set is left alone."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcdist.distributed.cpubind import bind_cpu_rank, describe, rank_cpus


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


def _hyperthreads(cores: int) -> Callable[[int], tuple[int, int]]:
    """Linux's usual numbering: CPU c and CPU c + cores are the two threads of core c."""
    return lambda cpu: (0, cpu % cores)


def test_with_a_core_per_thread_each_rank_gets_one_thread_of_its_own_cores() -> None:
    allowed, topology = range(16), _hyperthreads(8)
    assert [rank_cpus(allowed, r, 2, 4, topology) for r in range(2)] == [
        (0, 1, 2, 3),
        (4, 5, 6, 7),
    ]  # not 8-11, the siblings of rank 0's cores


def test_with_fewer_cores_than_threads_each_rank_gets_whole_cores() -> None:
    allowed, topology = range(8), _hyperthreads(4)
    assert [rank_cpus(allowed, r, 2, 3, topology) for r in range(2)] == [
        (0, 4, 1, 5),
        (2, 6, 3, 7),
    ]


def test_adjacent_siblings_are_kept_together_too() -> None:
    def adjacent(cpu: int) -> tuple[int, int]:
        return (0, cpu // 2)  # CPUs 2k and 2k + 1 share core k

    assert [rank_cpus(range(8), r, 2, 2, adjacent) for r in range(2)] == [(0, 2), (4, 6)]
    assert [rank_cpus(range(8), r, 2, 4, adjacent) for r in range(2)] == [
        (0, 1, 2, 3),
        (4, 5, 6, 7),
    ]


def test_packages_are_filled_one_after_the_other() -> None:
    def two_sockets(cpu: int) -> tuple[int, int]:
        return (cpu % 2, cpu // 2)  # even CPUs on socket 0, odd on socket 1

    assert rank_cpus(range(8), 0, 2, 4, two_sockets) == (0, 2, 4, 6)
    assert rank_cpus(range(8), 1, 2, 4, two_sockets) == (1, 3, 5, 7)


@given(
    n=st.integers(1, 256),
    world=st.integers(2, 16),
    threads=st.integers(1, 32),
    per_core=st.integers(1, 4),
)
def test_slices_never_overlap_and_stay_inside_the_set(
    n: int, world: int, threads: int, per_core: int
) -> None:
    allowed = list(range(0, 2 * n, 2))

    def core_of(cpu: int) -> tuple[int, int]:
        return (0, cpu // (2 * per_core))

    slices = [rank_cpus(allowed, r, world, threads, core_of) for r in range(world)]
    if n < world * threads:
        assert slices == [None] * world
        return
    taken = [cpu for cpus in slices for cpu in (cpus or ())]
    assert len(taken) == len(set(taken)) >= world * threads
    assert all(len(cpus or ()) >= threads for cpus in slices)
    assert set(taken) <= set(allowed)


def test_slurms_own_binding_choice_is_respected() -> None:
    before = os.sched_getaffinity(0)
    assert bind_cpu_rank(0, 2, 1, {"SLURM_CPU_BIND": "quiet,none"}) is None
    assert os.sched_getaffinity(0) == before


def test_describe_folds_runs() -> None:
    assert describe([0, 1, 2, 3]) == "0-3"
    assert describe([5, 0, 2, 1]) == "0-2,5"
    assert describe([7]) == "7"
    assert describe([]) == ""
