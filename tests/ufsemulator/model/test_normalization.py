"""Normalisation statistics: sharded over ranks equals one process."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

import numpy as np
import pytest
import torch

from ufsemulator.model.normalization import MIN_STD, Stats, input_range, stats_from_shard


class FakeGroup:
    """In-process stand-in for a process group: ranks are threads, all_reduce sums."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.slots: list[np.ndarray | None] = [None] * world_size
        self.barrier = threading.Barrier(world_size)
        self.calls = 0

    def all_reduce_for(self, rank: int) -> Callable[[np.ndarray], np.ndarray]:
        def all_reduce(vector: np.ndarray) -> np.ndarray:
            assert vector.dtype == np.float64
            self.slots[rank] = vector.copy()
            self.barrier.wait()
            total = np.sum([s for s in self.slots if s is not None], axis=0)
            if rank == 0:
                self.calls += 1
            self.barrier.wait()
            return total

        return all_reduce

    def run(self, shards: list[tuple[np.ndarray, np.ndarray]]) -> list[Stats]:
        results: list[Stats | None] = [None] * self.world_size
        errors: list[BaseException] = []

        def work(rank: int) -> None:
            try:
                x, y = shards[rank]
                results[rank] = stats_from_shard(x, y, self.all_reduce_for(rank))
            except BaseException as exc:  # surfaced in the main thread
                errors.append(exc)
                self.barrier.abort()

        threads = [threading.Thread(target=work, args=(r,)) for r in range(self.world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        if errors:
            raise errors[0]
        return [r for r in results if r is not None]


def _data(n: int = 1000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    scale = np.array([1, 0.5, 10, 10, 1, 0.2, 3, 0.1, 0.1, 5, 5, 4, 60, 100])
    offset = np.array([5, 34, -10, -10, 1, 0.2, 4, 0, 0, 0, 0, 3, 300, 100])
    x = (rng.standard_normal((n, 14)) * scale + offset).astype(np.float32)
    y = rng.uniform(0, 1, (n, 1)).astype(np.float32)
    return x, y


def _assert_equal_stats(a: Stats, b: Stats, rtol: float = 1e-12) -> None:
    for name in ("input_mean", "input_std", "output_mean", "output_std"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=rtol, err_msg=name)


def test_single_process_stats_match_numpy() -> None:
    x, y = _data()
    stats = stats_from_shard(x, y)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    np.testing.assert_allclose(stats.input_mean, x64.mean(0), rtol=1e-12)
    np.testing.assert_allclose(stats.input_std, x64.std(0), rtol=1e-12)
    np.testing.assert_allclose(stats.output_mean, y64.mean(0), rtol=1e-12)
    np.testing.assert_allclose(stats.output_std, y64.std(0), rtol=1e-12)
    assert stats.input_mean.dtype == np.float64 and stats.input_std.shape == (14,)
    assert stats.output_mean.shape == (1,)


@pytest.mark.parametrize("sizes", [(500, 500), (1, 299, 700), (250, 0, 250, 500)])
def test_sharded_stats_equal_single_process_on_every_rank(sizes: tuple[int, ...]) -> None:
    x, y = _data(sum(sizes))
    bounds = np.cumsum((0, *sizes))
    shards = [(x[a:b], y[a:b]) for a, b in itertools.pairwise(bounds)]
    group = FakeGroup(len(sizes))
    per_rank = group.run(shards)
    assert len(per_rank) == len(sizes)
    single = stats_from_shard(x, y)
    for stats in per_rank:
        _assert_equal_stats(stats, single)
        _assert_equal_stats(stats, per_rank[0], rtol=0.0)  # bitwise identical across ranks
    assert group.calls == 2


def test_constant_columns_get_unit_std() -> None:
    x, y = _data(100)
    x[:, 3] = 7.0
    x[:, 4] = 0.0
    x[:50, 5], x[50:, 5] = 1.0, 1.0 + 1e-7
    y[:] = 0.25
    stats = stats_from_shard(x, y)
    assert stats.input_std[3] == stats.input_std[4] == 1.0
    assert stats.input_std[5] == 1.0
    assert stats.output_std[0] == 1.0 and stats.output_mean[0] == 0.25
    assert (stats.input_std[[0, 1, 2]] > MIN_STD).all() and stats.input_std[0] != 1.0


def test_large_mean_small_spread_keeps_precision() -> None:
    rng = np.random.default_rng(1)
    x = (271.15 + 1e-3 * rng.standard_normal((10000, 14))).astype(np.float64)
    stats = stats_from_shard(x, np.zeros((10000, 1)))
    np.testing.assert_allclose(stats.input_std, x.std(0), rtol=1e-9)


def test_torch_tensors_are_accepted() -> None:
    x, y = _data(64)
    _assert_equal_stats(
        stats_from_shard(torch.from_numpy(x), torch.from_numpy(y)), stats_from_shard(x, y)
    )


def test_mismatched_rows_and_empty_data_are_errors() -> None:
    x, y = _data(10)
    with pytest.raises(ValueError, match="10 rows but targets 9"):
        stats_from_shard(x, y[:9])
    with pytest.raises(ValueError, match="zero samples"):
        stats_from_shard(x[:0], y[:0])


@pytest.mark.parametrize("rows", [0, 1, 1000])
def test_input_range_is_the_float64_range_of_the_values(rows: int) -> None:
    x = torch.from_numpy(np.random.default_rng(rows).normal(1e3, 7.0, (rows, 4)).astype(np.float32))
    low, high = input_range(x)
    assert low.dtype == high.dtype == torch.float64
    if rows:
        assert torch.equal(low, x.double().amin(0)) and torch.equal(high, x.double().amax(0))
    else:  # no rows: a range that any other rank's widens
        assert torch.equal(low, torch.full((4,), torch.inf, dtype=torch.float64))
        assert torch.equal(high, torch.full((4,), -torch.inf, dtype=torch.float64))
