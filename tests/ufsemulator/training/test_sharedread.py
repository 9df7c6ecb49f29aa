"""Reading a multi-file data set in shares: the split, the balancing, a run end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.ufsemulator.training.test_training import data_dir, run_single, single_process, smoke  # noqa: F401
from ufsemulator.data.makedays import write_days
from ufsemulator.data.read import DataOptions, load_dataset
from ufsemulator.errors import DataError
from ufsemulator.training.sharedread import block_moves, validation_rows


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

    def dataset(path: Path, *args: object) -> object:
        opened.append(Path(path).name)
        return real(path, *args)

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
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, days: list[Path]
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
