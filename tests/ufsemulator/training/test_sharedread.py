"""Reading a multi-file data set in shares: the split, the balancing, a run end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hpcdist.distributed import single_process as single_context
from tests.ufsemulator.training.test_training import data_dir, run_single, single_process, smoke  # noqa: F401
from ufsemulator.data.makedays import write_days
from ufsemulator.data.read import DataOptions, Dataset, load_dataset
from ufsemulator.errors import DataError
from ufsemulator.model.emulator import EmulatorMLP
from ufsemulator.training.sharedread import (
    SplitTimes,
    block_moves,
    device_rows,
    host_rows,
    split_share,
    validation_rows,
)
from ufsemulator.training.train import _model_config


@pytest.mark.parametrize(
    ("counts", "rank", "send", "receive", "per"),
    [
        ([4, 4], 0, [4, 0], [4, 0], 4),  # balanced: nothing moves
        ([6, 2], 0, [4, 2], [4, 0], 4),  # rank 0 gives its last 2 rows to rank 1
        ([6, 2], 1, [0, 2], [2, 2], 4),
        ([3, 5, 0, 4], 2, [0, 0, 0, 0], [0, 2, 0, 1], 3),  # an empty rank is filled
        ([3, 5, 0, 4], 3, [0, 0, 1, 3], [0, 0, 0, 3], 3),
        ([3, 5, 0, 5], 3, [0, 0, 1, 3], [0, 0, 0, 3], 3),  # its last row: the remainder
    ],
)
def test_block_moves_cut_the_rows_into_equal_blocks(
    counts: list[int], rank: int, send: list[int], receive: list[int], per: int
) -> None:
    assert block_moves(counts, rank) == (send, receive, per)


def test_every_rank_ends_with_the_same_number_of_rows() -> None:
    counts = [7, 0, 13, 2]
    moves = [block_moves(counts, r) for r in range(4)]
    assert [sum(receive) for _, receive, _ in moves] == [5, 5, 5, 5]
    # what rank i sends to j is what j receives from i
    assert all(moves[i][0][j] == moves[j][1][i] for i in range(4) for j in range(4))


def test_validation_rows_depend_on_the_row_not_on_who_reads_it() -> None:
    file = np.repeat(np.arange(4, dtype=np.int64), 5000)
    record = np.zeros(20000, dtype=np.int64)
    index = np.tile(np.arange(5000, dtype=np.int64), 4)
    whole = validation_rows(file, record, index, seed=42, fraction=0.2)
    part = validation_rows(file[7000:], record[7000:], index[7000:], seed=42, fraction=0.2)
    assert np.array_equal(whole[7000:], part)
    assert 0.19 < whole.mean() < 0.21
    assert not np.array_equal(whole, validation_rows(file, record, index, 43, 0.2))
    # Record 1 of file 0 is not file 1's record 0: rows of different records differ.
    swapped = validation_rows(record, file, index, seed=42, fraction=0.2)
    assert not np.array_equal(whole, swapped)


def _uniform(file: np.ndarray, record: np.ndarray, index: np.ndarray, seed: int) -> np.ndarray:
    """The split's hash as a float in [0, 1), written out as first defined: the reference
    the integer comparison must agree with."""

    def mix(z: np.ndarray) -> np.ndarray:
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))

    with np.errstate(over="ignore"):
        seeded = np.uint64((seed * 0x9E3779B97F4A7C15) & ((1 << 64) - 1))
        where = (file.astype(np.uint64) << np.uint64(24)) + record.astype(np.uint64)
        z = mix(mix(where + seeded) ^ index.astype(np.uint64))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)


@pytest.mark.parametrize("seed", [0, 42, 2**40 + 3])
@pytest.mark.parametrize("fraction", [-0.5, 0.0, 1e-9, 0.2, 0.5, 0.999999, 1.0, 1.5])
def test_validation_rows_are_the_rows_whose_hash_is_below_the_fraction(
    seed: int, fraction: float
) -> None:
    rng = np.random.default_rng(seed % 1000)
    file, record = rng.integers(0, 40, 50_000), rng.integers(0, 30, 50_000)
    index = rng.integers(0, 1_555_200, 50_000)
    expected = _uniform(file, record, index, seed) < fraction
    assert np.array_equal(validation_rows(file, record, index, seed, fraction), expected)


def test_a_row_whose_hash_equals_the_fraction_is_a_training_row() -> None:
    file, record, index = (np.arange(5, dtype=np.int64) for _ in range(3))
    exact = float(_uniform(file, record, index, 7)[2])  # a multiple of 2**-53: exact
    assert not validation_rows(file, record, index, 7, exact)[2]
    assert validation_rows(file, record, index, 7, float(np.nextafter(exact, 1.0)))[2]


def _dataset(n: int, n_in: int = 3) -> Dataset:
    rng = np.random.default_rng(5)
    inputs = rng.normal(size=(n, n_in)).astype(np.float32)
    return Dataset(
        inputs=inputs,
        targets=(inputs[:, :1] * 2 + 1).astype(np.float32),
        lat=np.zeros(n, np.float32),
        lon=np.zeros(n, np.float32),
        index=np.arange(n, dtype=np.int64),
        grid_shape=(1, n),
        target_names=("aice",),
        source="test",
        input_names=("a", "b", "c")[:n_in],
        record=np.zeros(n, dtype=np.int64),
        file=np.zeros(n, dtype=np.int64),
    )


@pytest.mark.parametrize("gather", [host_rows, device_rows])
def test_rows_keep_their_order_with_the_target_last(gather: object) -> None:
    dataset = _dataset(6)
    is_val = np.array([False, True, False, False, True, False])
    train_rows, val_rows = gather(dataset, is_val, torch.device("cpu"))  # type: ignore[operator]
    both = np.hstack([dataset.inputs, dataset.targets])
    assert np.array_equal(train_rows.numpy(), both[[0, 2, 3, 5]])
    assert np.array_equal(val_rows.numpy(), both[[1, 4]])
    assert train_rows.dtype == val_rows.dtype == torch.float32


def test_split_times_name_every_stage_with_their_sum() -> None:
    times = SplitTimes(device=0.5, hash=0.01, rows=0.1, wait=0.2, exchange=0.3, statistics=0.04)
    assert times.describe(3) == (
        "[Rank 3] Split 1.15 s: device 0.500, hash 0.010, rows 0.100, wait 0.200, "
        "exchange 0.300, statistics 0.040"
    )


def test_one_process_split_normalises_every_row_and_times_its_stages() -> None:
    config = smoke()
    dataset = _dataset(5000)
    model = EmulatorMLP(_model_config(config, dataset.input_names))
    times = SplitTimes()
    shards = split_share(single_context({}), config, dataset, model, times)
    is_val = validation_rows(
        dataset.file,
        dataset.record,
        dataset.index,
        config.training.seed,
        config.training.val_fraction,
    )
    assert (shards.n_train, shards.n_val) == (int((~is_val).sum()), int(is_val.sum()))
    assert torch.allclose(shards.x_train.mean(0), torch.zeros(3), atol=1e-5)
    assert torch.allclose(shards.y_train.std(0, unbiased=False), torch.ones(1), atol=1e-5)
    assert torch.equal(model.input_max.float(), torch.from_numpy(dataset.inputs[~is_val].max(0)))
    assert times.hash > 0 and times.rows > 0 and times.statistics > 0
    assert times.exchange >= 0 and times.wait >= 0


@pytest.fixture(scope="module")
def days(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return list(write_days(tmp_path_factory.mktemp("days"), 40, 32, 3, jobs=2).paths)


@pytest.mark.parametrize("time", ["all", "0:"])  # a share of the files; of the records
def test_shares_add_up_to_the_whole(days: list[Path], time: str) -> None:
    whole = load_dataset(days)
    options = DataOptions(time=time)
    parts = [load_dataset(days, options, share=(r, 2)) for r in range(2)]
    assert [p.files_read for p in parts] == [(0, 1), (1, 3)]
    assert [p.n_records for p in parts] == [1, 2]
    expected = [None, None] if time == "all" else [(0, 1), (1, 3)]
    assert [p.records_read for p in parts] == expected
    for name in ("inputs", "file", "record", "index"):
        joined = np.concatenate([getattr(p, name) for p in parts])
        assert np.array_equal(joined, getattr(whole, name))
    assert sum(p.bytes_read for p in parts) == pytest.approx(whole.bytes_read, abs=2)


def test_a_share_of_the_files_opens_only_its_files(
    monkeypatch: pytest.MonkeyPatch, days: list[Path]
) -> None:
    import ufsemulator.data.ncread as ncread

    opened: list[str] = []
    real = ncread.netCDF4.Dataset

    def dataset(path: Path, *args: object, **kwargs: object) -> object:
        opened.append(Path(path).name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(ncread.netCDF4, "Dataset", dataset)
    part = load_dataset(days, share=(1, 2))
    assert opened == [days[1].name, days[2].name]
    opened.clear()
    whole = load_dataset(days)  # one rank, every file: each opened once
    assert opened == [path.name for path in days] and whole.records_read == (0, 3)
    assert part.records_text().startswith("files 1..2 (2 records of a 32x40 grid, 2000-01-03")


def test_more_ranks_than_files_is_an_error_that_says_so(days: list[Path]) -> None:
    with pytest.raises(DataError, match="3 file\\(s\\) cannot be shared by 4 ranks"):
        load_dataset(days, share=(0, 4))


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_a_run_on_daily_files_reports_where_its_time_went(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    days: list[Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    whole = load_dataset(days)
    result = run_single(
        monkeypatch, smoke(epochs=2), data_path=[str(p) for p in days], run_dir=tmp_path
    )
    results = json.loads((tmp_path / "training_results.json").read_text())
    assert results["n_train"] + results["n_val"] == len(whole)  # one rank: no remainder
    assert result.epochs_run == 2 and (tmp_path / "model.pt").is_file()
    timings = results["timings"]
    parts = ("imports_s", "process_group_s", "data_s", "setup_s")
    assert timings["startup_s"] == pytest.approx(sum(timings[k] for k in parts), abs=0.01)
    assert timings["total_s"] > timings["startup_s"] + timings["steps_s"] > 0
    assert timings["epochs"] == 2
    (split_line,) = [line for line in capsys.readouterr().out.splitlines() if "Split" in line]
    assert split_line.startswith("[Rank 0] Split ") and "exchange" in split_line
