"""The synthetic CICE file and the reader that reads it (and real CICE output)."""

from __future__ import annotations

import os
from pathlib import Path

import netCDF4
import numpy as np
import pytest

from ufsemulator.data.read import INPUT_NAMES, DataError, DataOptions, load_dataset, make_synthetic
from ufsemulator.data.synthetic import VARIABLES, solar_declination

NI, NJ = 48, 40

UNITS = {
    "aice_h": "1",
    "hi_h": "m",
    "hs_h": "m",
    "Tsfc_h": "degC",
    "sst_h": "degC",
    "Tair_h": "degC",
    "sss_h": "ppt",
    "sice_h": "ppt",
    "Qref_h": "g/kg",
    "flwdn_h": "W/m2",
    "fswdn_h": "W/m2",
    "uocn_h": "m/s",
    "vocn_h": "m/s",
    "uatm_h": "m/s",
    "vatm_h": "m/s",
}


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_synthetic(tmp_path_factory.mktemp("data") / "iceh.nc", ni=NI, nj=NJ, seed=0)


@pytest.fixture(scope="module")
def fields(synthetic: Path) -> dict[str, np.ndarray]:
    """Ocean points of every variable, as float64, plus lat."""
    with netCDF4.Dataset(synthetic) as nc:
        ocean = nc["tmask"][:] == 1
        out = {name: np.asarray(nc[name][0][ocean], dtype=np.float64) for name in UNITS}
        out["lat"] = np.asarray(nc["TLAT"][:][ocean], dtype=np.float64)
    return out


def test_synthetic_has_cice_variables_units_and_fill(synthetic: Path) -> None:
    with netCDF4.Dataset(synthetic) as nc:
        assert dict(nc.dimensions.items()).keys() >= {"time", "nj", "ni"}
        assert (len(nc.dimensions["time"]), len(nc.dimensions["nj"]), len(nc.dimensions["ni"])) == (
            1,
            NJ,
            NI,
        )
        assert set(UNITS) == set(VARIABLES)
        land = nc["tmask"][:] == 0
        assert 0.1 < land.mean() < 0.6
        assert set(np.unique(nc["tmask"][:])) == {0.0, 1.0}
        assert nc["TLAT"].units == "degrees_north" and nc["ULON"].units == "degrees_east"
        for name, units in UNITS.items():
            var = nc[name]
            assert var.dimensions == ("time", "nj", "ni")
            assert var.dtype == np.float32
            assert var.units == units
            assert var.long_name and var.cell_measures == "area: tarea"
            assert var._FillValue == np.float32(1e30)
            data = var[0]
            assert np.ma.getmaskarray(data)[land].all(), name
            assert not np.ma.getmaskarray(data)[~land].any(), name


def test_synthetic_is_reproducible_from_its_seed(tmp_path: Path) -> None:
    def sst(seed: int) -> np.ndarray:
        path = make_synthetic(tmp_path / f"s{seed}.nc", ni=24, nj=20, seed=seed)
        with netCDF4.Dataset(path) as nc:
            return np.ma.filled(nc["sst_h"][0], np.nan)

    np.testing.assert_array_equal(sst(3), sst(3))
    assert not np.array_equal(sst(3), sst(4), equal_nan=True)
    assert not list(tmp_path.glob(".*.tmp")), "temporary files left behind"


def test_sst_is_never_below_the_salinity_freezing_point(fields: dict[str, np.ndarray]) -> None:
    tf = -0.054 * fields["sss_h"]
    assert (fields["sst_h"] >= tf - 1e-4).all()
    assert fields["sss_h"].min() >= 30.0 and fields["sss_h"].max() <= 37.0
    ice = fields["aice_h"] > 0.5
    assert ice.sum() > 10
    assert (fields["sst_h"][ice] - tf[ice]).max() < 1.0, "ice over warm water"


def test_ice_properties_vanish_without_ice(fields: dict[str, np.ndarray]) -> None:
    aice = fields["aice_h"]
    assert aice.min() >= 0.0 and aice.max() <= 1.0
    water, ice = aice == 0.0, aice > 0.0
    assert water.sum() > 100 and ice.sum() > 50
    for name in ("hi_h", "hs_h", "sice_h"):
        assert (fields[name][water] == 0.0).all(), name
        assert (fields[name][ice] > 0.0).all(), name
    assert (fields["Tsfc_h"][ice] <= 0.0).all()
    assert fields["hi_h"][ice].max() < 6.0


def test_no_shortwave_in_the_polar_night(fields: dict[str, np.ndarray]) -> None:
    night_edge = 90.0 - abs(solar_declination())
    assert 66.0 < night_edge < 68.0  # 1 January
    lat, fsw = fields["lat"], fields["fswdn_h"]
    assert (lat > night_edge + 0.5).sum() > 0
    assert (fsw[lat > night_edge + 0.5] == 0.0).all()
    assert (fsw[lat < -60.0] > 100.0).all(), "southern summer must be sunlit"
    assert (fsw >= 0.0).all()


def test_air_fields_follow_air_temperature(fields: dict[str, np.ndarray]) -> None:
    tair = fields["Tair_h"]
    for name in ("Qref_h", "flwdn_h"):
        assert np.corrcoef(tair, fields[name])[0, 1] > 0.9, name
    assert (fields["Qref_h"] > 0).all() and (fields["flwdn_h"] > 100).all()


def test_reader_rows_follow_design_order(synthetic: Path) -> None:
    ds = load_dataset(synthetic, DataOptions(mask="ocean"))
    assert ds.inputs.shape == (len(ds), 14) and ds.inputs.dtype == np.float32
    assert ds.targets.shape == (len(ds), 1) and ds.targets.dtype == np.float32
    assert ds.lat.shape == ds.lon.shape == ds.index.shape == (len(ds),)
    assert ds.input_names == INPUT_NAMES and ds.target_names == ("aice",)
    assert ds.grid_shape == (NJ, NI)
    history = {
        "sst": "sst_h",
        "sss": "sss_h",
        "tair": "Tair_h",
        "tsfc": "Tsfc_h",
        "hi": "hi_h",
        "hs": "hs_h",
        "sice": "sice_h",
        "uocn": "uocn_h",
        "vocn": "vocn_h",
        "uatm": "uatm_h",
        "vatm": "vatm_h",
        "qref": "Qref_h",
        "flwdn": "flwdn_h",
        "fswdn": "fswdn_h",
    }
    assert tuple(history) == INPUT_NAMES
    with netCDF4.Dataset(synthetic) as nc:
        for column, name in enumerate(INPUT_NAMES):
            grid = np.asarray(nc[history[name]][0]).ravel()
            np.testing.assert_array_equal(ds.inputs[:, column], grid[ds.index], err_msg=name)
        aice = np.asarray(nc["aice_h"][0]).ravel()
        np.testing.assert_array_equal(ds.targets[:, 0], aice[ds.index])
        np.testing.assert_array_equal(ds.lat, np.asarray(nc["TLAT"][:]).ravel()[ds.index])
        assert len(ds) == int((nc["tmask"][:] == 1).sum())


def test_mask_modes_select_ice_ocean_or_a_balanced_mix(synthetic: Path) -> None:
    ice = load_dataset(synthetic, DataOptions(mask="sea_ice"))
    ocean = load_dataset(synthetic, DataOptions(mask="ocean"))
    both = load_dataset(synthetic, DataOptions(mask="both"))
    assert (ice.targets > 0).all()
    assert (ocean.targets == 0).any()
    assert set(ice.index) < set(both.index) < set(ocean.index)
    n_water = int((both.targets == 0).sum())
    assert 0.5 * len(ice) <= n_water <= 2.0 * len(ice)
    assert np.all(np.diff(both.index) > 0), "grid order kept"


@pytest.mark.parametrize("mask", ["sea_ice", "ocean", "both"])
def test_thinning_keeps_every_kth_selected_point(synthetic: Path, mask: str) -> None:
    full = load_dataset(synthetic, DataOptions(mask=mask))
    thin = load_dataset(synthetic, DataOptions(mask=mask, thin=3))
    np.testing.assert_array_equal(thin.index, full.index[::3])
    np.testing.assert_array_equal(thin.inputs, full.inputs[::3])


@pytest.mark.parametrize(("target", "column"), [("sst", 0), ("tair", 2)])
def test_target_can_be_sst_or_tair(synthetic: Path, target: str, column: int) -> None:
    ds = load_dataset(synthetic, DataOptions(mask="ocean", target=target))
    assert ds.target_names == (target,)
    np.testing.assert_array_equal(ds.targets[:, 0], ds.inputs[:, column])


def _write_alternative(path: Path) -> None:
    """A file with the other common names: no _h suffix, no time axis, 1-D lat/lon, no mask."""
    nj, ni = 5, 6
    alt = {
        "sst": "sst",
        "sss": "sss",
        "tair": "tair",
        "tsfc": "Tsfc",
        "hi": "hi",
        "hs": "hs",
        "sice": "sice",
        "uocn": "uocn",
        "vocn": "vocn",
        "uatm": "uatm",
        "vatm": "vatm",
        "qref": "Qref",
        "flwdn": "flw",
        "fswdn": "fsw",
    }
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("lat", nj)
        nc.createDimension("lon", ni)
        nc.createVariable("lat", "f8", ("lat",))[:] = np.linspace(60, 80, nj)
        nc.createVariable("lon", "f8", ("lon",))[:] = np.linspace(0, 300, ni)
        for k, name in enumerate(INPUT_NAMES):
            var = nc.createVariable(alt[name], "f4", ("lat", "lon"), fill_value=-999.0)
            values = np.full((nj, ni), float(k), dtype=np.float32)
            values[0, 0] = np.nan if name == "sst" else values[0, 0]
            var[:] = np.ma.masked_array(values, mask=np.zeros_like(values, bool))
        aice = nc.createVariable("aice", "f4", ("lat", "lon"), fill_value=-999.0)
        values = np.linspace(0, 1, nj * ni, dtype=np.float32).reshape(nj, ni)
        mask = np.zeros((nj, ni), bool)
        mask[4, 5] = True  # one fill point
        aice[:] = np.ma.masked_array(values, mask=mask)


def test_reader_falls_back_to_alternative_names(tmp_path: Path) -> None:
    path = tmp_path / "alt.nc"
    _write_alternative(path)
    ds = load_dataset(path, DataOptions(mask="ocean"))
    # 30 points: one NaN sst, one fill aice are dropped.
    assert len(ds) == 28
    assert ds.grid_shape == (5, 6)
    np.testing.assert_array_equal(ds.inputs[0], np.arange(14, dtype=np.float32))
    assert ds.lat[0] == 60.0 and ds.lon[1] == 120.0
    assert 0 not in ds.index and 29 not in ds.index
    ice = load_dataset(path, DataOptions(mask="sea_ice"))
    assert len(ice) == 28  # aice > 0 everywhere except the NaN/fill points (0 is at [0, 0])


def test_missing_variable_is_named(tmp_path: Path) -> None:
    path = tmp_path / "partial.nc"
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("nj", 2)
        nc.createDimension("ni", 2)
        nc.createVariable("sst_h", "f4", ("nj", "ni"))[:] = 1.0
    with pytest.raises(DataError, match=r"partial\.nc.*'sss'.*sss_h"):
        load_dataset(path)


@pytest.mark.parametrize("content", [None, b"", b"not a netCDF file at all"])
def test_bad_or_missing_file_is_a_data_error(tmp_path: Path, content: bytes | None) -> None:
    path = tmp_path / "bad.nc"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(DataError, match=r"bad\.nc"):
        load_dataset(path)


def test_no_selected_point_is_a_data_error(tmp_path: Path) -> None:
    path = tmp_path / "alt.nc"
    _write_alternative(path)
    with netCDF4.Dataset(path, "a") as nc:
        nc["aice"][:] = 0.0
    with pytest.raises(DataError, match=r"no points.*sea_ice"):
        load_dataset(path, DataOptions(mask="sea_ice"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"mask": "land"}, "mask"), ({"thin": 0}, "thin"), ({"target": "hi"}, "target")],
)
def test_bad_options_are_rejected(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DataOptions(**kwargs)  # type: ignore[arg-type]


def test_cache_hit_does_not_reopen_the_netcdf(
    synthetic: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = DataOptions(mask="both", thin=2, cache_dir=tmp_path / "cache")
    first = load_dataset(synthetic, options)
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 1

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("netCDF reopened on a cache hit")

    monkeypatch.setattr(netCDF4, "Dataset", refuse)
    second = load_dataset(synthetic, options)
    for name in ("inputs", "targets", "lat", "lon", "index"):
        np.testing.assert_array_equal(getattr(first, name), getattr(second, name))
    assert second.grid_shape == first.grid_shape and second.source == first.source
    # Other options are another cache entry, so they do read the file.
    with pytest.raises(AssertionError, match="reopened"):
        load_dataset(synthetic, DataOptions(mask="both", thin=3, cache_dir=tmp_path / "cache"))


def test_cache_is_invalidated_when_the_file_changes(tmp_path: Path) -> None:
    path = make_synthetic(tmp_path / "iceh.nc", ni=24, nj=20, seed=0)
    options = DataOptions(mask="ocean", cache_dir=tmp_path / "cache")
    before = load_dataset(path, options)
    make_synthetic(path, ni=24, nj=20, seed=1)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    after = load_dataset(path, options)
    assert not np.array_equal(before.inputs, after.inputs)
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 2


def test_damaged_cache_is_rebuilt(synthetic: Path, tmp_path: Path) -> None:
    options = DataOptions(mask="sea_ice", cache_dir=tmp_path)
    first = load_dataset(synthetic, options)
    (cache_file,) = tmp_path.glob("*.npz")
    cache_file.write_bytes(b"garbage")
    again = load_dataset(synthetic, options)
    np.testing.assert_array_equal(first.inputs, again.inputs)
