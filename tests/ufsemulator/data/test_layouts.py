"""Files nobody here wrote: every layout the generator writes, read by the one reader."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import netCDF4
import numpy as np
import pytest

from ufsemulator.data.ncread import candidate_names, detect_suffix
from ufsemulator.data.read import DataOptions, load_dataset
from ufsemulator.data.sources import parse_time
from ufsemulator.data.synthfiles import write_layout
from ufsemulator.errors import DataError
from ufsemulator.variables import INPUT_NAMES

NI, NJ = 24, 20
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three hourly records in one file: the layouts below must read the same numbers."""
    return write_layout(tmp_path_factory.mktemp("ref") / "ref.nc", "hourly", NI, NJ, records=3)[0]


def _options(**kwargs: object) -> DataOptions:
    return DataOptions(mask="ocean", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("layout", "suffix"), [("hourly", "aice_h"), ("daily", "aice_d"), ("monthly", "aice")]
)
def test_each_cice_stream_is_found_by_its_suffix(
    tmp_path: Path, reference: Path, layout: str, suffix: str
) -> None:
    (path,) = write_layout(tmp_path / "iceh.nc", layout, NI, NJ, records=3)
    with netCDF4.Dataset(path) as nc:
        assert suffix in nc.variables and nc[suffix].shape == (3, NJ, NI)
    ds = load_dataset(path, _options())
    ref = load_dataset(reference, _options())
    np.testing.assert_array_equal(ds.inputs, ref.inputs)
    np.testing.assert_array_equal(ds.record, ref.record)
    assert f"suffix '{suffix[4:] or '(none)'}'" in " ".join(ds.notes)


def test_cf_pair_reads_the_same_numbers_in_our_units(tmp_path: Path, reference: Path) -> None:
    ocean, atm = write_layout(tmp_path / "ocn.nc", "cf", NI, NJ, records=3)
    assert atm.name == "ocn_atm.nc"
    with netCDF4.Dataset(atm) as nc:
        assert nc["air_temperature"].units == "K" and "Tair" not in nc.variables
    ds = load_dataset(ocean, _options(), atmosphere=atm)
    ref = load_dataset(reference, _options())
    # No mask in the CF files: land is where the ocean fields are missing, as tmask says.
    np.testing.assert_array_equal(ds.index, ref.index)
    np.testing.assert_allclose(ds.inputs, ref.inputs, rtol=1e-6, atol=2e-5)  # K -> degC
    notes = " ".join(ds.notes)
    assert "converted from K to degC" in notes and "kg kg-1 to g/kg" in notes
    assert "no land mask" in notes


def test_cf_ocean_file_alone_serves_a_model_without_forcing(tmp_path: Path) -> None:
    ocean, _ = write_layout(tmp_path / "ocn.nc", "cf", NI, NJ)
    ocean_inputs = ("sst", "sss", "tsfc", "hi", "hs", "sice", "uocn", "vocn")
    ds = load_dataset(ocean, _options(inputs=ocean_inputs))
    assert ds.inputs.shape == (len(ds), 8) and ds.input_names == ocean_inputs
    with pytest.raises(DataError, match=r"lacks 6 needed field\(s\): 'tair' .*'fswdn'"):
        load_dataset(ocean, _options())


def test_several_files_are_one_time_axis(tmp_path: Path, reference: Path) -> None:
    paths = write_layout(tmp_path / "iceh.nc", "daily", NI, NJ, records=1, files=3)
    assert [p.name for p in paths] == ["iceh.0001.nc", "iceh.0002.nc", "iceh.0003.nc"]
    ref = load_dataset(reference, _options())
    by_glob = load_dataset(str(tmp_path / "iceh.*.nc"), _options())
    by_list = load_dataset([str(p) for p in paths], _options())
    for ds in (by_glob, by_list):
        np.testing.assert_array_equal(ds.inputs, ref.inputs)
        assert sorted(set(ds.file.tolist())) == [0, 1, 2] and set(ds.record.tolist()) == {0}
        assert ds.records_read == (0, 3) and ds.files_read == (0, 3) and ds.n_records == 3
    assert "(3 files)" in by_glob.source
    # Reversed list, reversed time: the order given is the order read.
    reverse = load_dataset([str(p) for p in reversed(paths)], _options(time=0))
    np.testing.assert_array_equal(reverse.inputs, ref.inputs[ref.record == 2])


@pytest.mark.parametrize(
    ("time", "records"),
    [
        ("all", [0, 1, 2]),
        (0, [0]),
        (2, [2]),
        ("-1", [2]),
        ("1:", [1, 2]),
        (":2", [0, 1]),
        ("0:1", [0]),
        ("-2:", [1, 2]),
    ],
)
def test_time_selects_records_over_all_files(
    tmp_path: Path, reference: Path, time: str | int, records: list[int]
) -> None:
    ds = load_dataset(reference, _options(time=time))
    assert sorted(set(ds.record.tolist())) == records
    assert parse_time(time).pick(3) == records


@pytest.mark.parametrize(
    ("time", "message"),
    [(3, "out of range.*3 records"), ("-4", "out of range"), ("2:2", "no record")],
)
def test_time_outside_the_files_is_a_data_error(
    reference: Path, time: str | int, message: str
) -> None:
    with pytest.raises(DataError, match=message):
        load_dataset(reference, _options(time=time))


@pytest.mark.parametrize("time", ["last", "1:2:3", "1.5", True])
def test_malformed_time_is_rejected(time: object) -> None:
    with pytest.raises(ValueError, match="all, INDEX or START:STOP"):
        DataOptions(time=time)  # type: ignore[arg-type]


def test_t_points_are_preferred_and_u_points_are_said(tmp_path: Path) -> None:
    (path,) = write_layout(tmp_path / "iceh.nc", "hourly", NI, NJ)
    with netCDF4.Dataset(path) as nc:
        tmask, umask = nc["tmask"][:] > 0.5, nc["umask"][:] > 0.5
        tlat = np.asarray(nc["TLAT"][:])
    assert umask.sum() < tmask.sum() and not (umask & ~tmask).any()
    t_points = load_dataset(path, _options())
    assert len(t_points) == int(tmask.sum()) and not any("U-point" in n for n in t_points.notes)
    np.testing.assert_array_equal(t_points.lat, tlat.ravel()[t_points.index])
    with netCDF4.Dataset(path, "a") as nc:
        for name in ("TLAT", "TLON", "tmask"):
            nc.renameVariable(name, f"{name}_gone")
    u_points = load_dataset(path, _options())
    assert len(u_points) == int(umask.sum())
    assert any("U-point ULAT, ULON, umask" in n for n in u_points.notes)


def test_every_missing_variable_is_named_in_one_line(tmp_path: Path) -> None:
    (path,) = write_layout(tmp_path / "iceh.nc", "daily", NI, NJ)
    with netCDF4.Dataset(path, "a") as nc:
        for name in ("sss_d", "Qref_d", "fswdn_d"):
            nc[name].delncattr("standard_name")  # else found by it, as it should be
            nc.renameVariable(name, name.upper() + "_X")
    with pytest.raises(DataError) as info:
        load_dataset(path, _options())
    message = str(info.value)
    assert "\n" not in message and "lacks 3 needed field(s)" in message
    for name, first in (("sss", "sss_d"), ("qref", "Qref_d"), ("fswdn", "fswdn_d")):
        assert f"'{name}' (tried: {first}, " in message
    assert "sea_surface_salinity" in message and "iceh.nc" in message


@pytest.mark.parametrize(
    ("attrs", "bad"),
    [
        ({"_FillValue": -999.0}, -999.0),
        ({"missing_value": -99.0}, -99.0),
        ({}, 1.0e30),
        ({}, -1.0e21),
        ({}, float("nan")),
    ],
)
def test_every_kind_of_missing_value_drops_the_point(
    tmp_path: Path, attrs: dict[str, float], bad: float
) -> None:
    path = tmp_path / "miss.nc"
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("nj", 2)
        nc.createDimension("ni", 3)
        for k, name in enumerate(("aice", *INPUT_NAMES)):
            fill = attrs.get("_FillValue")
            var = nc.createVariable(
                name if name != "tair" else "Tair", "f4", ("nj", "ni"), fill_value=fill
            )
            if "missing_value" in attrs:
                var.missing_value = np.float32(attrs["missing_value"])
            var.set_auto_mask(False)
            values = np.full((2, 3), 0.5 + k, dtype=np.float32)
            if name == "hs":
                values[1, 2] = bad
            var[:] = values
        nc.createVariable("lat", "f4", ("nj",))[:] = [70.0, 80.0]
        nc.createVariable("lon", "f4", ("ni",))[:] = [0.0, 10.0, 20.0]
    ds = load_dataset(path, _options())
    assert len(ds) == 5 and 5 not in ds.index


def test_suffix_detection_counts_names() -> None:
    assert detect_suffix(["aice_d", "hi_d", "sst_d", "TLAT", "time"]) == "_d"
    assert detect_suffix(["aice", "hi", "sst_h"]) == ""
    assert detect_suffix(["sea_ice_area_fraction", "lat"]) is None
    assert candidate_names("tair", "_d")[:3] == ["Tair_d", "Tair_h", "Tair"]
    assert candidate_names("tair", None)[-1] == "air_temperature"


@pytest.mark.parametrize(
    ("inputs", "message"),
    [((), "non-empty"), (("sst", "ice"), "'ice' is not one"), (("sst", "sst"), "repeat")],
)
def test_bad_inputs_are_rejected(inputs: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DataOptions(inputs=inputs)


def test_cache_sees_every_file_of_a_series(tmp_path: Path) -> None:
    paths = write_layout(tmp_path / "iceh.nc", "hourly", NI, NJ, files=2)
    options = _options(cache_dir=tmp_path / "cache")
    first = load_dataset(paths, options)
    again = load_dataset(paths, options)
    np.testing.assert_array_equal(first.inputs, again.inputs)
    assert again.notes == first.notes
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 1
    # The second file changes (another seed): the cached arrays must not be reused.
    write_layout(paths[1].with_name("other.nc"), "hourly", NI, NJ, seed=5)
    paths[1].with_name("other.nc").replace(paths[1])
    changed = load_dataset(paths, options)
    assert not np.array_equal(changed.inputs, first.inputs)
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 2
    # A subset of the files, or other inputs, is another entry.
    load_dataset(paths[:1], options)
    load_dataset(paths, _options(cache_dir=tmp_path / "cache", inputs=("sst", "hi")))
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 4


def test_model_module_does_not_import_netcdf() -> None:
    code = (
        "import sys, ufsemulator.model.emulator, ufsemulator.export.torchscript; "
        "print('netCDF4' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------ the smoke config on each layout

SMOKE_LAYOUTS = {
    "hourly": ("hourly", 1, 1),
    "daily": ("daily", 1, 1),
    "monthly": ("monthly", 1, 1),
    "cf-pair": ("cf", 1, 1),
    "records": ("hourly", 3, 1),
    "files": ("daily", 1, 3),
}


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("name", list(SMOKE_LAYOUTS))
def test_smoke_config_trains_on_each_layout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    import torch

    from tests.ufsemulator.training.test_training import LAUNCH_VARS, SMOKE
    from ufsemulator.config import Config, load_config
    from ufsemulator.training.train import train

    monkeypatch.setenv("HPCDIST_DATA_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    for var in LAUNCH_VARS:
        monkeypatch.delenv(var, raising=False)
    layout, records, files = SMOKE_LAYOUTS[name]
    paths = write_layout(tmp_path / "data.nc", layout, 40, 32, records=records, files=files)
    data: dict[str, object] = {"path": [str(p) for p in paths]}
    if layout == "cf":
        data = {"path": [str(p) for p in paths[::2]], "atmosphere": [str(p) for p in paths[1::2]]}
    merged = load_config(SMOKE).to_dict()
    merged["data"].update(data)
    merged["export"]["names"] = "jedi"
    config = Config.from_dict(merged)
    result = train(config, run_dir=tmp_path / "run")
    assert result.status == "completed" and result.epochs_run == 3
    history = json.loads((tmp_path / "run" / "training_results.json").read_text())["history"]
    assert history["val_loss"][-1] < history["val_loss"][0]  # it learns from what it read
    loaded = torch.jit.load(str(tmp_path / "run" / "model.pt"))
    assert loaded.output_names == ["sea_ice_area_fraction"]
    assert loaded.input_names[0] == "sea_water_potential_temperature"


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_model_normalisation_and_export_follow_data_inputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A background without atmospheric forcing: the CF ocean/ice file alone, 8 inputs."""
    import torch

    from tests.ufsemulator.training.test_training import LAUNCH_VARS, SMOKE
    from ufsemulator.__main__ import main
    from ufsemulator.config import Config, load_config
    from ufsemulator.training.train import train

    monkeypatch.setenv("HPCDIST_DATA_DIR", str(tmp_path / "cache"))
    for var in LAUNCH_VARS:
        monkeypatch.delenv(var, raising=False)
    ocean, _ = write_layout(tmp_path / "ocn.nc", "cf", 40, 32)
    inputs = ["hi", "sst", "sss", "tsfc", "hs", "sice", "uocn", "vocn"]  # any order
    merged = load_config(SMOKE).to_dict()
    merged["data"].update({"path": str(ocean), "inputs": inputs})
    result = train(Config.from_dict(merged), run_dir=tmp_path / "run")
    assert result.model.input_names == inputs and result.model.input_mean.shape == (8,)
    assert result.model.input_mean[0] == pytest.approx(
        float(load_dataset(ocean, DataOptions(inputs=tuple(inputs))).inputs[:, 0].mean()), rel=0.2
    )
    assert (
        main(
            [
                "export",
                "--checkpoint",
                str(tmp_path / "run" / "best_model.pt"),
                "--out",
                str(tmp_path / "m.pt"),
                "--names",
                "jedi",
            ]
        )
        == 0
    )
    loaded = torch.jit.load(str(tmp_path / "m.pt"))
    assert list(loaded.input_names) == [
        "sea_ice_volume",
        "sea_water_potential_temperature",
        "sea_water_salinity",
        "snow_ice_surface_temperature",
        "sea_ice_snow_volume",
        "bulk_ice_salinity",
        "eastward_sea_water_velocity",
        "northward_sea_water_velocity",
    ]
    assert list(loaded.input_levels) == [0] * 8
    inside = loaded.input_mean.repeat(3, 1)  # a background mostly out of range is refused
    assert loaded.jac_physical(inside, torch.ones(3, 1)).shape == (3, 1, 8)
