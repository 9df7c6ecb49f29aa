"""make-data --grid --days: names, the seasonal cycle, the command line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ufsemulator.__main__ import main
from ufsemulator.data.makedays import day_paths, parse_grid
from ufsemulator.data.read import load_dataset
from ufsemulator.data.synthetic import synthetic_fields


@pytest.mark.parametrize(
    ("text", "grid"), [("1440x1080", (1440, 1080)), (" 4X4 ", (4, 4)), ("384x320", (384, 320))]
)
def test_parse_grid(text: str, grid: tuple[int, int]) -> None:
    assert parse_grid(text) == grid


@pytest.mark.parametrize("text", ["1440", "3x4", "4x3", "axb", "1440x1080x2", ""])
def test_parse_grid_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="--grid"):
        parse_grid(text)


def test_day_names_follow_the_noleap_calendar() -> None:
    paths = day_paths(Path("d"), 61)
    assert paths[0].name == "iceh.2000-01-01.nc" and paths[30].name == "iceh.2000-01-31.nc"
    assert paths[59].name == "iceh.2000-03-01.nc"  # no 29 February in the synthetic calendar
    assert len({p.name for p in paths}) == 61


def test_day_zero_is_the_january_field_and_the_season_moves() -> None:
    january, *_ = synthetic_fields(40, 32, 1)
    same, *_ = synthetic_fields(40, 32, 1, day_of_year=0)
    july, *_ = synthetic_fields(40, 32, 1, day_of_year=182)
    assert all(np.array_equal(january[k], same[k]) for k in january)
    assert july["aice_h"].sum() < january["aice_h"].sum()  # the northern ice melts back
    assert july["fswdn_h"][-1].mean() > january["fswdn_h"][-1].mean()  # Arctic sun


def test_make_data_days_writes_a_daily_series(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["make-data", "--grid", "40x32", "--days", "2", "--jobs", "2", "--out", str(tmp_path)]
    )
    assert code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "iceh.2000-01-01.nc",
        "iceh.2000-01-02.nc",
    ]
    assert "Wrote 2 daily files 40x32" in capsys.readouterr().out
    data = load_dataset(str(tmp_path / "iceh.*.nc"))
    assert "stream suffix '_d'" in data.notes[0] and set(data.file.tolist()) == {0, 1}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--grid", "40"], "--grid must be NIxNJ"),
        (["--grid", "40x32", "--days", "0"], "--days must be >= 1, got 0"),
        (["--grid", "40x32", "--days", "1", "--jobs", "0"], "--jobs must be >= 1, got 0"),
    ],
)
def test_make_data_days_rejects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(["make-data", "--out", str(tmp_path / "d"), *argv]) == 2
    assert message in capsys.readouterr().err
