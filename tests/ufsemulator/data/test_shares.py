"""Reading a series in shares: which files a rank reads, records across files of different
lengths, one grid for the files that share it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import netCDF4
import numpy as np
import pytest

from ufsemulator.data.read import DataOptions, load_dataset
from ufsemulator.data.shares import file_blocks
from ufsemulator.data.synthfiles import write_cice
from ufsemulator.errors import DataError

NI, NJ = 24, 20


@pytest.mark.parametrize(
    ("sizes", "world", "blocks"),
    [
        ([1] * 30, 4, [(0, 7), (7, 15), (15, 22), (22, 30)]),  # 7, 8, 7, 8 of 30 days
        ([1] * 8, 4, [(0, 2), (2, 4), (4, 6), (6, 8)]),
        ([1] * 4, 4, [(0, 1), (1, 2), (2, 3), (3, 4)]),  # one file each: the fewest
        ([5, 1, 1, 1], 2, [(0, 1), (1, 4)]),  # by bytes, not by count
        ([1, 1, 1, 5], 2, [(0, 3), (3, 4)]),
        ([100, 1, 1, 1], 4, [(0, 1), (1, 2), (2, 3), (3, 4)]),  # each rank keeps a file
        ([1, 1, 1, 100], 3, [(0, 2), (2, 3), (3, 4)]),  # the large file alone
        ([0, 0, 0], 2, [(0, 1), (1, 3)]),  # empty files: counted as equal
        ([7, 3], 1, [(0, 2)]),
    ],
)
def test_file_blocks_are_contiguous_and_balanced_by_bytes(
    sizes: list[int], world: int, blocks: list[tuple[int, int]]
) -> None:
    assert file_blocks(sizes, world) == blocks


def test_a_file_whose_middle_is_on_a_boundary_goes_to_the_later_rank() -> None:
    # Middles at 0.5, 1.5, 2.5 (x 2 ranks of 3 bytes): 1.5 is the boundary itself.
    assert file_blocks([1, 1, 1], 2) == [(0, 1), (1, 3)]
    assert file_blocks([1, 1, 1, 1], 2) == [(0, 2), (2, 4)]


def test_fewer_files_than_ranks_is_an_error_that_says_so() -> None:
    with pytest.raises(DataError, match=r"3 file\(s\) cannot be shared by 4 ranks"):
        file_blocks([1, 1, 1], 4)


@pytest.fixture(scope="module")
def uneven(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Files of 2, 1 and 3 records, one time axis of 6."""
    folder = tmp_path_factory.mktemp("uneven")
    paths, first = [], 0
    for k, records in enumerate((2, 1, 3)):
        paths.append(write_cice(folder / f"s{k}.nc", NI, NJ, 0, "_h", records, first))
        first += records
    return paths


@pytest.mark.parametrize(
    ("time", "files", "records"),
    [
        ("all", [0, 0, 1, 2, 2, 2], [0, 1, 0, 0, 1, 2]),
        ("1:3", [0, 1], [1, 0]),  # the last record of file 0, the only one of file 1
        ("2:3", [1], [0]),
        ("3:", [2, 2, 2], [0, 1, 2]),
        ("-1", [2], [2]),
    ],
)
def test_records_are_counted_across_files_of_different_lengths(
    uneven: list[Path], time: str, files: list[int], records: list[int]
) -> None:
    ds = load_dataset(uneven, DataOptions(mask="ocean", time=time))
    pairs = sorted(set(zip(ds.file.tolist(), ds.record.tolist(), strict=True)))
    assert pairs == sorted(zip(files, records, strict=True))


def test_shares_of_files_of_different_lengths_read_whole_files(uneven: list[Path]) -> None:
    whole = load_dataset(uneven, DataOptions(mask="ocean"))
    parts = [load_dataset(uneven, DataOptions(mask="ocean"), share=(r, 2)) for r in range(2)]
    # Bytes: the 2- and 1-record files together are the 3-record file's size.
    assert [p.files_read for p in parts] == [(0, 2), (2, 3)]
    assert [p.n_records for p in parts] == [3, 3]
    assert np.array_equal(np.concatenate([p.inputs for p in parts]), whole.inputs)
    # Counted over all files: record 3 of the series is file 2's record 0.
    by_records = load_dataset(uneven, DataOptions(mask="ocean", time="0:"), share=(1, 2))
    assert by_records.records_read == (3, 6) and by_records.files_read == (2, 3)


def test_files_on_one_grid_share_it_and_a_changed_grid_is_read_again(tmp_path: Path) -> None:
    paths = [write_cice(tmp_path / f"d{k}.nc", NI, NJ, 0, "_d", 1, k) for k in range(3)]
    with netCDF4.Dataset(paths[2], "a") as nc:  # the last file: one more land point
        mask = nc.variables["tmask"]
        ocean = np.flatnonzero(mask[...].ravel() > 0.5)[0]
        values = mask[...]
        values.ravel()[ocean] = 0.0
        mask[...] = values
    whole = load_dataset(paths, DataOptions(mask="ocean"))
    alone = [load_dataset(path, DataOptions(mask="ocean")) for path in paths]
    assert np.array_equal(whole.inputs, np.concatenate([a.inputs for a in alone]))
    assert [int((whole.file == k).sum()) for k in range(3)] == [len(a) for a in alone]
    assert len(alone[2]) == len(alone[1]) - 1  # the changed mask was read, not reused


@pytest.mark.parametrize(
    "attributes",
    [
        {"_FillValue": -999.0},  # a fill below the 1e20 threshold
        {"missing_value": np.array([-5.0, -7.0], dtype=np.float32)},
        {"_FillValue": -999.0, "missing_value": -5.0},
        {"_FillValue": np.nan},
        {"valid_range": np.array([-6.0, 100.0], dtype=np.float32)},  # netCDF4 masks it
        {"scale_factor": 0.5, "add_offset": 1.0},  # packed: netCDF4 unpacks it
        {},  # no fill: the default fill (9.97e36) is past the threshold
    ],
)
def test_points_read_as_the_whole_grid_reads_them(
    tmp_path: Path, attributes: dict[str, object]
) -> None:
    from ufsemulator.data.ncread import GroupReader

    path = write_cice(tmp_path / "f.nc", NI, NJ, 0, "_h", 1)
    special = np.array([-999.0, -5.0, -7.0, 3.0, np.nan, 1e30, -6.5, 2.0], dtype=np.float32)
    with netCDF4.Dataset(path, "a") as nc:
        fill = attributes.get("_FillValue")
        var = nc.createVariable("odd", "f4", ("time", "nj", "ni"), fill_value=fill)
        for name, value in attributes.items():
            if name != "_FillValue":
                var.setncattr(name, value)
        values = np.resize(special, NJ * NI).reshape(1, NJ, NI)
        var.set_auto_maskandscale(False)
        var[...] = values
    with GroupReader([path], ["sst"]) as reader:
        reader.found["odd"] = dataclasses.replace(reader.found["sst"], variable="odd")
        points = np.arange(0, NI * NJ, 3)
        whole = reader.read_field("odd", 0).ravel()[points]
        assert np.array_equal(reader.read_points("odd", 0, points), whole, equal_nan=True)
        assert np.isnan(whole).any() and np.isfinite(whole).any()


def test_fields_are_read_past_hdf5s_chunk_cache(tmp_path: Path) -> None:
    from ufsemulator.data.ncread import GroupReader

    path = write_cice(tmp_path / "f.nc", NI, NJ, 0, "_d", 1)
    with GroupReader([path], ["sst", "aice"]) as reader:
        caches = {
            name: reader._nc[0].variables[found.variable].get_var_chunk_cache()[0]
            for name, found in reader.found.items()
        }
        grid_cache = reader._nc[0].variables["TLAT"].get_var_chunk_cache()[0]
    assert caches == {"sst": 0, "aice": 0}
    assert grid_cache > 0  # a contiguous variable is left as it is


@pytest.mark.parametrize(
    "attributes",
    [{"_FillValue": -999.0}, {"missing_value": -5.0}, {"valid_range": np.array([-80.0, 80.0])}],
)
def test_the_grid_converts_as_netcdf4_masks(tmp_path: Path, attributes: dict[str, object]) -> None:
    from ufsemulator.data.ncread import GroupReader
    from ufsemulator.data.ncvalues import read_float

    path = write_cice(tmp_path / "f.nc", NI, NJ, 0, "_d", 1)
    with netCDF4.Dataset(path, "a") as nc:
        nc.renameVariable("TLAT", "TLAT_old")
        var = nc.createVariable("TLAT", "f4", ("nj", "ni"), fill_value=attributes.get("_FillValue"))
        for name, value in attributes.items():
            if name != "_FillValue":
                var.setncattr(name, value)
        values = nc.variables["TLAT_old"][...].copy()
        values.ravel()[:4] = [-999.0, -5.0, 85.0, 1e30]
        var.set_auto_maskandscale(False)
        var[...] = values
    with GroupReader([path], ["sst", "aice"]) as reader, netCDF4.Dataset(path) as nc:
        expected = read_float(nc.variables["TLAT"], 0, path)
        assert np.array_equal(reader.lat, expected, equal_nan=True)
        assert np.isnan(reader.lat.ravel()[:4]).sum() >= 2
