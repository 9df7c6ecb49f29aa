"""The recipes for a DA background (ufsemulator/configs/*_background.yaml): SOCA-only and
coupled ocean/atmosphere, their names, units and levels, and land stored as 0.0 or a
sentinel (export.land_value) treated like missing rows."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from ufsemulator.__main__ import main
from ufsemulator.config import ConfigError, ExportConfig, default_config_path, load_config
from ufsemulator.export.torchscript import export_model, read_extra_files
from ufsemulator.model.emulator import EmulatorMLP, ModelConfig
from ufsemulator.variables import UNITS

from .test_export import _load

CONFIGS = default_config_path().parent
# SOCA's names and units as SOCA defines them: JCSDA/soca, test/Data/fields_metadata.yml at
# commit 964fd662 (October 2024) names each field and the restart it is read from (MOM6's
# Temp, Salt, u, v; CICE's Tair_h, Tsfc_h, sice_h), and
# src/soca/VariableChange/Model2GeoVaLs/Model2GeoVaLs.F90 copies them without conversion
# (only skin_temperature_at_surface_where_sea adds 273.15): MOM6's degC and psu, CICE's
# degC and ppt. src/soca/MLBalance/MLJac.h reads the same seven as its inputs.
SOCA = {
    "sea_water_potential_temperature": ("degC", 0),
    "sea_water_salinity": ("ppt", 0),
    "eastward_sea_water_velocity": ("m/s", 0),
    "northward_sea_water_velocity": ("m/s", 0),
    "air_temperature": ("degC", 0),
    "snow_ice_surface_temperature": ("degC", 0),
    "bulk_ice_salinity": ("ppt", 0),
}
RECIPES = {
    "soca_background.yaml": SOCA,
    "coupled_background.yaml": {
        "sea_water_potential_temperature": ("degC", 0),
        "sea_water_salinity": ("ppt", 0),
        "eastward_sea_water_velocity": ("m/s", 0),
        "northward_sea_water_velocity": ("m/s", 0),
        "air_temperature": ("K", 126),
        "eastward_wind": ("m/s", 126),
        "northward_wind": ("m/s", 126),
        "water_vapor_mixing_ratio_wrt_moist_air": ("kg/kg", 126),
        "surface_downwelling_longwave_flux_in_air": ("W/m2", 0),
        "surface_downwelling_shortwave_flux_in_air": ("W/m2", 0),
    },
}


def recipe_model(inputs: tuple[str, ...]) -> EmulatorMLP:
    torch.manual_seed(0)
    model = EmulatorMLP(ModelConfig(n_in=len(inputs), input_names=inputs, hidden=(8,),
                                    input_levels=(0,) * len(inputs)))  # fmt: skip
    native = {"degC": (0.0, 10.0), "ppt": (33.0, 1.0), "m/s": (0.0, 3.0), "g/kg": (1.5, 1.0)}
    low, high = [], []
    for name in inputs:
        mean, spread = native.get(UNITS[name], (200.0, 100.0))
        low.append(mean - spread)
        high.append(mean + spread)
    model.set_input_range(low, high)
    return model.eval()


def background(model: EmulatorMLP, units: list[str], rows: int) -> torch.Tensor:
    """Rows in the middle of the training range, in the export's units."""
    x = (model.input_min + model.input_max) / 2
    shift = torch.tensor([273.15 if u == "K" else 0.0 for u in units])
    scale = torch.tensor([1e-3 if u == "kg/kg" else 1.0 for u in units])
    return ((x * scale + shift).repeat(rows, 1)).double()


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_recipe_names_units_and_levels(recipe: str, tmp_path: Path) -> None:
    config = load_config(CONFIGS / recipe)
    model = recipe_model(config.data.inputs)
    loaded = _load(export_model(model, tmp_path / "m.pt", config.export))
    got = {
        name: (unit, level)
        for name, unit, level in zip(
            loaded.input_names, loaded.input_units, loaded.input_levels, strict=True
        )
    }
    assert got == RECIPES[recipe]
    assert list(loaded.output_names) == ["sea_ice_area_fraction"]
    assert (loaded.row_flags(background(model, list(loaded.input_units), 3)) == 0).all()


@pytest.mark.parametrize(
    ("recipe", "land_value"),
    [("soca_background.yaml", None), ("coupled_background.yaml", -999.0)],
)
def test_land_rows_are_missing(recipe: str, land_value: float | None, tmp_path: Path) -> None:
    """Land as SOCA's 0.0 (the recipe) or a finite sentinel: flagged 2, predict's fill
    value, zero Jacobian, tangent linear and adjoint; a sea row with one ocean input at the
    land value is not land."""
    config = load_config(CONFIGS / recipe)
    # The sea row with one input at the land value is out of range: 1 of 3 rows with data,
    # more than the default max_out_of_range; this test is about land, so no refusal.
    options = ExportConfig(**{**config.export.__dict__, "max_out_of_range": 1.0})
    if land_value is not None:
        options = ExportConfig(**{**options.__dict__, "land_value": land_value})
    model = recipe_model(config.data.inputs)
    loaded = _load(export_model(model, tmp_path / "m.pt", options))
    value = 0.0 if land_value is None else land_value
    x = background(model, list(loaded.input_units), 4)
    ocean = [k for k, n in enumerate(config.data.inputs) if n in ("sst", "sss", "uocn", "vocn")]
    x[1, ocean] = value  # land
    x[2, ocean[0]] = value  # sea, one input at the land value (and out of range or not)
    flags = loaded.row_flags(x).tolist()
    assert flags[1] == 2 and flags[0] == 0 and flags[2] != 2
    assert math.isnan(loaded.predict(x)[1, 0]) and not math.isnan(loaded.predict(x)[0, 0])
    assert (loaded.jac_physical(x.float(), torch.ones(4, 1))[1] == 0).all()
    assert (loaded.jac_physical(x.float(), torch.ones(4, 1))[0] != 0).any()
    assert (loaded.tlm(x, torch.ones_like(x))[1] == 0).all()
    assert (loaded.adjoint(x, torch.ones(4, 1, dtype=x.dtype))[1] == 0).all()
    sig = json.loads(read_extra_files(tmp_path / "m.pt")["signature.json"])
    assert sig["land_value"] == value and len(sig["land_inputs"]) == len(ocean)


def test_the_soca_recipe_trains_and_exports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HPCDIST_DATA_DIR", str(tmp_path / "cache"))
    run = tmp_path / "run"
    sets: list[Any] = []
    for value in ("data.synthetic={ni: 40, nj: 32, seed: 0}", "model.hidden_sizes=[8]",
                  "training.batch_size=100", "training.early_stopping_patience=0"):  # fmt: skip
        sets += ["--set", value]
    argv = ["train", "--config", str(CONFIGS / "soca_background.yaml"), "--run-dir", str(run)]
    assert main([*argv, "--epochs", "1", *sets]) == 0
    sig = json.loads(read_extra_files(run / "model.pt")["signature.json"])
    assert [i["name"] for i in sig["inputs"]] == list(RECIPES["soca_background.yaml"])
    assert [i["unit"] for i in sig["inputs"]] == [unit for unit, _ in SOCA.values()]
    assert sig["land_value"] == 0.0
    assert main(["export", "--describe", str(run / "model.pt")]) == 0
    out = capsys.readouterr().out
    assert "a row whose sea_water_potential_temperature, sea_water_salinity" in out


def test_soca_names_refuse_a_variable_soca_does_not_hold(tmp_path: Path) -> None:
    model = recipe_model(("sst", "hi"))
    with pytest.raises(ConfigError, match=r"a SOCA background holds no field for hi \(SOCA"):
        export_model(model, tmp_path / "m.pt", ExportConfig(names="soca"))


@pytest.mark.parametrize(
    ("names", "units"),
    [
        ("soca", ["degC", "degC", "degC"]),  # CICE's Tair_h, Tsfc_h in a SOCA background
        ("jedi", ["degC", "K", "degC"]),  # fv3-jedi's air_temperature in K
    ],
)
def test_air_temperature_takes_the_unit_of_its_background(
    names: str, units: list[str], tmp_path: Path
) -> None:
    model = recipe_model(("sst", "tair", "tsfc"))
    loaded = _load(export_model(model, tmp_path / "m.pt", ExportConfig(names=names)))
    assert list(loaded.input_units) == units
    assert list(loaded.input_names)[1] == "air_temperature"


@pytest.mark.parametrize(
    ("mapping", "accepted"),
    [
        ({"sst": "sea_surface_temperature", "uocn": "surface_eastward_sea_water_velocity"}, True),
        ({"sst": "sst", "uocn": "surface_eastward_sea_water_velocity"}, False),
        ({"sst": "sst", "uocn": "uocn"}, True),
    ],
)
def test_a_mapping_names_every_variable_in_one_scheme(
    mapping: dict[str, str], accepted: bool, tmp_path: Path
) -> None:
    """SOCA's surface names (degC for sea_surface_temperature, as SOCA holds it); short
    names mixed with a background's are refused."""
    model = EmulatorMLP(ModelConfig(n_in=2, input_names=("sst", "uocn"), input_levels=(0, 0)))
    options = ExportConfig(names={**mapping, "aice": "sea_ice_area_fraction"})
    if accepted and mapping["sst"] == "sst":
        options = ExportConfig(names={**mapping, "aice": "aice"})
    if not accepted:
        with pytest.raises(ConfigError, match=r"mixes our short names \(sst\)"):
            export_model(model, tmp_path / "m.pt", options)
        return
    loaded = _load(export_model(model, tmp_path / "m.pt", options))
    assert list(loaded.input_units) == ["degC", "m/s"]
