"""TorchScript export: what the C++ data-assimilation system loads."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.ufsemulator.model.test_model import make_model, physical_inputs
from ufsemulator.config import ConfigError, ExportConfig
from ufsemulator.errors import CheckpointError
from ufsemulator.export.torchscript import export_checkpoint, export_model, load_checkpoint_model
from ufsemulator.model.emulator import EmulatorMLP, ModelConfig
from ufsemulator.model.normalization import Stats
from ufsemulator.variables import INPUT_NAMES, JEDI_NAMES


def _load(path: Path) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.load(str(path))


def _checkpoint(model: EmulatorMLP) -> dict[str, Any]:
    """The checkpoint layout of docs/CONTRACTS.md, with everything weights_only allows."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    model(torch.zeros(2, model.n_in, dtype=model.input_mean.dtype)).sum().backward()
    optimizer.step()
    return {
        "model": model.state_dict(),
        "model_config": model.config.to_dict(),
        "optimizer": optimizer.state_dict(),
        "epoch": 3,
        "rng": {"torch": torch.get_rng_state()},
        "config": {"training": {"lr": 1e-4}},
    }


@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_round_trip_gives_identical_outputs(tmp_path: Path, activation: str) -> None:
    model = make_model(activation, n_out=2, dtype=torch.float32)
    out = export_model(model, tmp_path / "sub" / "emulator.pt")
    assert out == tmp_path / "sub" / "emulator.pt" and out.is_file()
    loaded = _load(out)
    x = physical_inputs(model, 64)
    x_norm = model.normalize_inputs(x)
    mask = torch.arange(64) % 3 != 0
    with torch.no_grad():
        assert torch.equal(loaded(x_norm), model(x_norm))
        assert torch.equal(loaded.predict(x), model.predict(x))
        assert torch.equal(loaded.jac_physical(x, mask), model.jac_physical(x, mask))
        assert torch.equal(loaded.jac_physical(x, None), model.jac_physical(x, None))
    assert not list(out.parent.glob(".*.tmp"))


def test_names_and_levels_travel_with_the_export(tmp_path: Path) -> None:
    config = ModelConfig(
        n_out=2,
        output_names=("aice", "y1"),
        output_levels=(0, 1),
        input_levels=tuple(range(14)),
        hidden=(8,),
        activation="silu",
    )
    loaded = _load(export_model(EmulatorMLP(config), tmp_path / "m.pt"))
    assert list(loaded.input_names) == list(config.input_names)
    assert list(loaded.output_names) == ["aice", "y1"]
    assert list(loaded.input_levels) == list(range(14))
    assert list(loaded.output_levels) == [0, 1]
    assert loaded.activation == "silu" and loaded.n_in == 14 and loaded.n_out == 2


def test_export_leaves_the_model_where_it_was(tmp_path: Path) -> None:
    model = make_model(dtype=torch.float32)
    model.train()
    export_model(model, tmp_path / "m.pt")
    assert model.training


def test_export_checkpoint_matches_the_trained_model(tmp_path: Path) -> None:
    model = make_model(dtype=torch.float32)
    path = tmp_path / "checkpoint.pt"
    torch.save(_checkpoint(model), path)
    loaded = _load(export_checkpoint(path, tmp_path / "emulator.pt"))
    x = physical_inputs(model, 16)
    with torch.no_grad():
        assert torch.equal(loaded.predict(x), model.predict(x))
        assert torch.equal(loaded.jac_physical(x, None), model.jac_physical(x, None))


def test_checkpoint_of_a_ddp_wrapped_model_loads(tmp_path: Path) -> None:
    model = make_model(dtype=torch.float32)
    state = _checkpoint(model)
    state["model"] = {f"module.{k}": v for k, v in state["model"].items()}
    torch.save(state, tmp_path / "ddp.pt")
    restored = load_checkpoint_model(tmp_path / "ddp.pt")
    assert torch.equal(restored.output_std, model.output_std)


def _truncated(path: Path) -> None:
    torch.save(_checkpoint(make_model(dtype=torch.float32)), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: None, "does not exist"),
        (lambda p: p.write_bytes(b""), "cannot load"),
        (lambda p: p.write_bytes(b"\x00garbage" * 100), "cannot load"),
        (_truncated, "cannot load"),
        (lambda p: torch.save([1, 2, 3], p), "expected a dict"),
        (lambda p: torch.save({"model": {}}, p), "lacks 'model_config'"),
        (
            lambda p: torch.save({"model": {}, "model_config": {"hidden": [8]}}, p),
            "do not fit",
        ),
        (
            lambda p: torch.save({"model": {}, "model_config": {"width": 8}}, p),
            "bad 'model_config'.*'width'",
        ),
    ],
)
def test_bad_checkpoint_is_a_checkpoint_error(tmp_path: Path, make: Any, message: str) -> None:
    path = tmp_path / "ckpt.pt"
    make(path)
    with pytest.raises(CheckpointError, match=message) as info:
        export_checkpoint(path, tmp_path / "out.pt")
    assert "ckpt.pt" in str(info.value)
    assert isinstance(info.value, ValueError)
    assert not (tmp_path / "out.pt").exists()


def test_checkpoint_with_pickled_objects_is_refused(tmp_path: Path) -> None:
    """weights_only=True: a checkpoint that needs arbitrary unpickling is not executed."""
    path = tmp_path / "ckpt.pt"
    torch.save({"model": {}, "model_config": ModelConfig()}, path)  # a dataclass, not a dict
    with pytest.raises(CheckpointError, match=r"ckpt\.pt"):
        export_checkpoint(path, tmp_path / "out.pt")


# ------------------------------------------------- what a C++ DA system meets in the export

JEDI_INPUTS = [
    "sea_water_potential_temperature",
    "sea_water_salinity",
    "air_temperature",
    "snow_ice_surface_temperature",
    "sea_ice_volume",
    "sea_ice_snow_volume",
    "bulk_ice_salinity",
    "eastward_sea_water_velocity",
    "northward_sea_water_velocity",
    "eastward_wind",
    "northward_wind",
    "water_vapor_mixing_ratio_wrt_moist_air",
    "surface_downwelling_longwave_flux_in_air",
    "surface_downwelling_shortwave_flux_in_air",
]


def aice_model() -> EmulatorMLP:
    """A float32 model with the design's names (aice out), as training exports it."""
    torch.manual_seed(0)
    model = EmulatorMLP(ModelConfig(hidden=(16, 16)))
    model.set_normalization(
        Stats(
            input_mean=[
                -1.0,
                33.0,
                -15.0,
                -12.0,
                1.5,
                0.2,
                4.0,
                0.0,
                0.0,
                2.0,
                0.0,
                1.5,
                250.0,
                30.0,
            ],
            input_std=[1.0, 1.0, 8.0, 7.0, 1.0, 0.1, 2.0, 0.1, 0.1, 5.0, 4.0, 0.8, 40.0, 50.0],
            output_mean=[0.6],
            output_std=[0.3],
        )
    )
    return model.eval()


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[EmulatorMLP, Any]:
    """The model and its export with JEDI names (and so their units), loaded with
    torch.jit.load."""
    model = aice_model()
    path = tmp_path_factory.mktemp("export") / "model.pt"
    return model, _load(export_model(model, path, ExportConfig(names="jedi", units="jedi")))


def jedi_inputs(model: EmulatorMLP, n: int, seed: int = 1) -> torch.Tensor:
    """Physical inputs in the units of their JEDI names (air and ice-surface temperatures
    in K, humidity in kg/kg, SOCA's ocean temperature in degC), float64."""
    x = physical_inputs(model, n, seed).double()
    x[:, 2] += 273.15  # tsfc: SOCA's snow_ice_surface_temperature, CICE's degC
    x[:, 11] *= 1e-3
    return x


def test_jedi_names_units_and_levels_travel_with_the_export(
    exported: tuple[EmulatorMLP, Any], tmp_path: Path
) -> None:
    _, loaded = exported
    assert list(loaded.input_names) == JEDI_INPUTS
    assert list(loaded.output_names) == ["sea_ice_area_fraction"]
    assert list(loaded.input_units)[:4] == ["degC", "ppt", "K", "degC"]  # SOCA's degC
    assert list(loaded.input_units)[11] == "kg/kg" and list(loaded.output_units) == ["1"]
    names = {name: JEDI_NAMES[name] for name in (*INPUT_NAMES, "aice")}
    names |= {"sst": "sea_surface_temperature", "qref": "specific_humidity"}
    options = ExportConfig(names=names, input_levels=tuple(range(14)), output_levels=(3,))
    other = _load(export_model(aice_model(), tmp_path / "m.pt", options))
    assert list(other.input_names)[:2] == ["sea_surface_temperature", "sea_water_salinity"]
    assert other.output_names == ["sea_ice_area_fraction"]
    # SOCA's sea_surface_temperature is in degC (MOM6's), specific_humidity in kg/kg.
    assert [other.input_units[k] for k in (0, 1, 2, 11)] == ["degC", "ppt", "K", "kg/kg"]
    assert list(other.input_levels) == list(range(14)) and list(other.output_levels) == [3]


# Every variable under its own short name: a mapping to change one of them from.
SAME = {name: name for name in (*INPUT_NAMES, "aice")}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (ExportConfig(names={"ssh": "x"}), "'ssh', which the model does not have"),
        (
            ExportConfig(names={"sst": "sea_surface_temperature", "aice": "siconc"}),
            "mapping lacks 'sss', 'tair', .*'fswdn': give every input",
        ),
        (ExportConfig(range_margin=-0.5), "range_margin must be >= 0, got -0.5"),
        (ExportConfig(units={"sst": "m"}), "gives sst in 'm', but its exported name 'sst' "),
        (ExportConfig(names="jedi", units="native"), "gives tair in 'degC', but .*carries K"),
        (ExportConfig(names={**SAME, "sst": "ssh"}), "'ssh' for 'sst' is not in the names"),
        (ExportConfig(names={**SAME, "sst": ""}), "'' for 'sst' is not in the names table"),
        (ExportConfig(names={**SAME, "sst": "sss"}), "'sss' for 'sst' is not in the names"),
        (ExportConfig(names={**SAME, "hi": "hs"}), "'hs' for 'hi' is not in the names table"),
        (ExportConfig(land_value=float("inf")), "land_value must be a finite number"),
        (ExportConfig(input_levels=(0, 1)), "input_levels must have 14 entries"),
    ],
)
def test_bad_export_options_are_named(tmp_path: Path, options: ExportConfig, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        export_model(aice_model(), tmp_path / "m.pt", options)
    assert not (tmp_path / "m.pt").exists()


def test_export_in_jedi_units_takes_kelvin_and_kg_per_kg(exported: tuple[EmulatorMLP, Any]) -> None:
    model, loaded = exported
    x_jedi = jedi_inputs(model, 32)
    x_native = physical_inputs(model, 32).double()
    with torch.no_grad():
        native = model.double().predict(x_native)
        jac_native = model.jac_physical(x_native)
        model.float()
    torch.testing.assert_close(loaded.predict(x_jedi), native, rtol=1e-5, atol=1e-5)
    jac = loaded.jac_physical(x_jedi, None)
    scale = torch.ones(14, dtype=torch.float64)
    scale[11] = 1e3  # d/d(kg/kg) = 1000 d/d(g/kg); d/dK = d/ddegC
    # The shifted mean is stored in float32 (271.65 K to ~2e-5): close, not equal.
    expected = jac_native * scale
    assert (jac - expected).norm() <= 1e-4 * expected.norm()


def test_exported_module_works_in_inference_mode_after_grad_mode(
    exported: tuple[EmulatorMLP, Any],
) -> None:
    model, loaded = exported
    assert not any(p.requires_grad for p in loaded.parameters())
    x = jedi_inputs(model, 8).float()
    dy = torch.ones(8, 1)
    calls = {
        "predict": lambda: loaded.predict(x),
        "jac": lambda: loaded.jac_physical(x, None),
        "tlm": lambda: loaded.tlm(x, x),
        "adjoint": lambda: loaded.adjoint(x, dy),
    }
    before = {name: [call() for _ in range(3)][-1] for name, call in calls.items()}  # grad mode
    with torch.inference_mode():
        for name, call in calls.items():
            for _ in range(3):
                assert torch.equal(call(), before[name]), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_exported_module_answers_in_the_inputs_dtype(
    exported: tuple[EmulatorMLP, Any], dtype: torch.dtype
) -> None:
    model, loaded = exported
    x = jedi_inputs(model, 16)
    mask = torch.ones(16, 1, dtype=torch.float32)
    outputs = (
        loaded.predict(x.to(dtype)),
        loaded.jac_physical(x.to(dtype), mask),
        loaded.tlm(x.to(dtype), x.to(dtype)),
        loaded.adjoint(x.to(dtype), torch.ones(16, 1, dtype=dtype)),
    )
    assert [o.dtype for o in outputs] == [dtype] * 4
    assert [tuple(o.shape) for o in outputs] == [(16, 1), (16, 1, 14), (16, 1), (16, 14)]
    reference = loaded.jac_physical(x.float(), mask).double()
    torch.testing.assert_close(outputs[1].double(), reference, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("bad", [1.0e30, -1.0e20, float("nan"), float("inf")])
def test_fill_and_nan_rows_predict_nan_and_a_zero_jacobian(
    exported: tuple[EmulatorMLP, Any], bad: float
) -> None:
    model, loaded = exported
    x = jedi_inputs(model, 6).float()
    clean_y, clean_jac = loaded.predict(x), loaded.jac_physical(x, None)
    x[[1, 4], [3, 0]] = bad
    y, jac = loaded.predict(x), loaded.jac_physical(x, torch.ones(6, 1))
    assert torch.isfinite(jac).all() and (jac[[1, 4]] == 0).all()
    assert torch.isnan(y[[1, 4]]).all() and torch.isfinite(y[[0, 2, 3, 5]]).all()
    assert loaded.row_flags(x).tolist() == [0, 2, 0, 0, 2, 0]
    keep = [0, 2, 3, 5]
    assert torch.equal(y[keep], clean_y[keep]) and torch.equal(jac[keep], clean_jac[keep])
    assert (loaded.tlm(x, torch.ones_like(x))[[1, 4]] == 0).all()


def test_fill_value_is_the_users(tmp_path: Path) -> None:
    x = physical_inputs(aice_model(), 3)
    x[1, 0] = 1.0e30
    options = ExportConfig(fill_value=-999.0)
    loaded = _load(export_model(aice_model(), tmp_path / "m.pt", options))
    y = loaded.predict(x)
    assert y[1, 0].item() == -999.0 and (y[[0, 2]] != -999.0).all()


def test_mask_multiplies_the_jacobian(exported: tuple[EmulatorMLP, Any]) -> None:
    model, loaded = exported
    x = jedi_inputs(model, 5).float()
    mask = torch.tensor([[1.0], [0.0], [0.5], [0.25], [float("nan")]])
    full = loaded.jac_physical(x, None)
    jac = loaded.jac_physical(x, mask)
    torch.testing.assert_close(jac[:4], full[:4] * mask[:4].reshape(4, 1, 1), rtol=0, atol=0)
    assert (jac[4] == 0).all()
    with pytest.raises(Exception, match="one value per input row"):
        loaded.jac_physical(x, torch.ones(4, 1))


def test_exported_jacobian_matches_float64_finite_differences(
    exported: tuple[EmulatorMLP, Any],
) -> None:
    model, loaded = exported
    x = jedi_inputs(model, 16)
    jac = loaded.jac_physical(x, None)
    fd = torch.zeros_like(jac)
    for k in range(14):
        h = 1e-5 * float(model.input_std[k]) * (1e-3 if k == 11 else 1.0)
        step = torch.zeros_like(x)
        step[:, k] = h
        fd[:, :, k] = (loaded.predict(x + step) - loaded.predict(x - step)) / (2 * h)
    assert (jac - fd).norm() <= 1e-6 * fd.norm()


def test_exported_tlm_and_adjoint_pass_the_dot_product_test(
    exported: tuple[EmulatorMLP, Any],
) -> None:
    model, loaded = exported
    x = jedi_inputs(model, 32)
    g = torch.Generator().manual_seed(7)
    dx = torch.randn(x.shape, generator=g, dtype=torch.float64)
    dy = torch.randn(32, 1, generator=g, dtype=torch.float64)
    lhs = torch.sum(loaded.tlm(x, dx) * dy)
    rhs = torch.sum(dx * loaded.adjoint(x, dy))
    assert abs(lhs - rhs) <= 1e-12 * max(abs(lhs.item()), abs(rhs.item()))
    # And the adjoint is the true one: autograd through the exported predict.
    xr = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(loaded.predict(xr), xr, grad_outputs=dy)
    torch.testing.assert_close(loaded.adjoint(x, dy), grad, rtol=1e-10, atol=1e-14)


def test_export_checkpoint_follows_the_checkpoints_export_section(tmp_path: Path) -> None:
    model = aice_model()
    state = _checkpoint(model)
    state["config"] = {"export": {"names": "jedi"}}
    torch.save(state, tmp_path / "ckpt.pt")
    loaded = _load(export_checkpoint(tmp_path / "ckpt.pt", tmp_path / "m.pt"))
    assert list(loaded.input_names) == JEDI_INPUTS and loaded.input_units[2] == "K"
    short = _load(export_checkpoint(tmp_path / "ckpt.pt", tmp_path / "s.pt", ExportConfig()))
    assert short.input_names[0] == "sst"


@pytest.mark.parametrize(
    ("inputs", "outputs", "message"),
    [
        (["a", "b", "a"], ["y"], "unique: 'a' names two inputs"),
        (["a", " "], ["y"], "must not be empty, got ' '"),
        (["a", "b"], [""], "must not be empty, got ''"),
        (["a", "y"], ["y"], "'y' names an input and an output"),
    ],
)
def test_exported_names_are_unique_non_empty_and_not_the_output(
    inputs: list[str], outputs: list[str], message: str
) -> None:
    from ufsemulator.export.names import check_distinct

    with pytest.raises(ValueError, match=message):
        check_distinct(inputs, outputs)
    check_distinct(["a", "b"], ["y"])


def test_an_input_named_like_the_output_is_refused(tmp_path: Path) -> None:
    """data.target: sst with sst among the inputs: SABER could not tell the two apart."""
    model = EmulatorMLP(ModelConfig(output_names=("sst",), hidden=(4,)))
    with pytest.raises(ConfigError, match="'sst' names an input and an output"):
        export_model(model, tmp_path / "m.pt")
    with pytest.raises(ConfigError, match="'sea_water_potential_temperature' names an input"):
        export_model(model, tmp_path / "m.pt", ExportConfig(names="jedi"))
