"""Reading a multi-file data set in shares: the split, the balancing, a run end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.ufsemulator.training.test_training import data_dir, run_single, single_process, smoke  # noqa: F401
from ufsemulator.data.makedays import write_days
from ufsemulator.data.read import load_dataset
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
    record = np.repeat(np.arange(4, dtype=np.int64), 5000)
    index = np.tile(np.arange(5000, dtype=np.int64), 4)
    whole = validation_rows(record, index, seed=42, fraction=0.2)
    part = validation_rows(record[7000:], index[7000:], seed=42, fraction=0.2)
    assert np.array_equal(whole[7000:], part)
    assert 0.19 < whole.mean() < 0.21
    assert not np.array_equal(whole, validation_rows(record, index, seed=43, fraction=0.2))


@pytest.fixture(scope="module")
def days(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return list(write_days(tmp_path_factory.mktemp("days"), 40, 32, 3, jobs=2).paths)


def test_shares_of_the_records_add_up_to_the_whole(days: list[Path]) -> None:
    whole = load_dataset(days)
    parts = [load_dataset(days, share=(r, 2)) for r in range(2)]
    assert [p.records_read for p in parts] == [(0, 1), (1, 3)]
    assert sum(len(p) for p in parts) == len(whole)
    assert np.array_equal(np.concatenate([p.inputs for p in parts]), whole.inputs)
    assert sum(p.bytes_read for p in parts) == pytest.approx(whole.bytes_read, abs=2)


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
