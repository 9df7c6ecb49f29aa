"""What a DA system can trust in an export: units bound to names, stored training ranges,
flagged rows, the fill value, the clamp, provenance inside the file and the model card."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.ufsemulator.model.test_model import physical_inputs
from ufsemulator.__main__ import main
from ufsemulator.config import ConfigError, ExportConfig
from ufsemulator.export import signature
from ufsemulator.export.torchscript import (
    check_export,
    export_checkpoint,
    export_model,
    load_checkpoint_model,
    read_extra_files,
)
from ufsemulator.model.emulator import EmulatorMLP, ModelConfig

from .test_export import JEDI_INPUTS, _checkpoint, _load, aice_model, jedi_inputs


def ranged_model() -> EmulatorMLP:
    """aice_model trained on [mean - 3 std, mean + 3 std] of every input."""
    model = aice_model()
    model.set_input_range(
        model.input_mean - 3 * model.input_std, model.input_mean + 3 * model.input_std
    )
    return model


@pytest.mark.parametrize(
    ("options", "units"),
    [
        (ExportConfig(names="jedi"), ["degC", "K", "K", "kg/kg"]),  # SOCA's degC
        (ExportConfig(names="jedi", units="jedi"), ["degC", "K", "K", "kg/kg"]),
        (ExportConfig(names="jedi", units={"tair": "kelvin"}), ["degC", "K", "K", "kg/kg"]),
        (ExportConfig(names="short"), ["degC", "degC", "degC", "g/kg"]),
        (ExportConfig(units="native"), ["degC", "degC", "degC", "g/kg"]),
    ],
)
def test_names_carry_their_units(tmp_path: Path, options: ExportConfig, units: list[str]) -> None:
    loaded = _load(export_model(aice_model(), tmp_path / "m.pt", options))
    assert [loaded.input_units[k] for k in (0, 2, 3, 11)] == units


def test_a_background_in_the_wrong_units_gets_zero_jacobians(tmp_path: Path) -> None:
    """What SABER does: names from the background, no units read, only jac_physical. A
    background in the right units gets the model's Jacobian; one in the wrong units (air
    temperature in degC where the name carries K, or an ocean temperature in K where
    SOCA's name carries degC) gets flagged rows and zero Jacobians, never a number."""
    model = ranged_model()
    x_native = physical_inputs(model, 32).double()
    x_right = jedi_inputs(model, 32)
    with torch.no_grad():
        truth = model.double().jac_physical(x_native)
        model.float()
    options = ExportConfig(names="jedi", out_of_range="fill")
    jedi = _load(export_model(model, tmp_path / "jedi.pt", options))
    jac = jedi.jac_physical(x_right.float(), torch.ones(32, 1))
    assert (jedi.row_flags(x_right) == 0).all() and (jac != 0).any(dim=2).all()
    assert (jac[:, 0, 0].double() - truth[:, 0, 0]).abs().max() <= 1e-4 * truth.abs().max()
    for column, shift in ((2, -273.15), (0, 273.15)):
        wrong = x_right.clone()
        wrong[:, column] += shift
        assert (jedi.row_flags(wrong) == 1).all()
        assert (jedi.jac_physical(wrong.float(), torch.ones(32, 1)) == 0).all()
        assert (jedi.tlm(wrong, torch.ones_like(wrong)) == 0).all()
        assert (jedi.adjoint(wrong, torch.ones(32, 1, dtype=wrong.dtype)) == 0).all()
        assert torch.isnan(jedi.predict(wrong)).all()
    # Checking units at the call (what a caller that knows them can add) names the culprit.
    sig = json.loads(read_extra_files(tmp_path / "jedi.pt")["signature.json"])
    background = {item["name"]: item["unit"] for item in sig["inputs"]}
    with pytest.raises(ValueError, match=r"air_temperature in degC .*takes K"):
        signature.check_units(sig, background | {"air_temperature": "degC"})
    signature.check_units(sig, background)


@pytest.mark.parametrize(
    ("value", "flag"),
    [(-3.6, 0), (-3.6001, 1), (3.6, 0), (3.6001, 1), (0.0, 0), (float("nan"), 2)],
)
def test_row_flags_mark_inputs_beyond_the_margin(value: float, flag: int) -> None:
    """Trained on [-3, 3] (in std units of input 4), margin 0.1: in range to +-3.6."""
    model = ranged_model()
    x = model.input_mean.double().repeat(2, 1)
    x[1, 4] = float(model.input_mean[4]) + value * float(model.input_std[4])
    assert model.double().row_flags(x).tolist() == [0, flag]


def test_ranges_travel_in_the_exports_units(tmp_path: Path) -> None:
    model = ranged_model()
    loaded = _load(export_model(model, tmp_path / "m.pt", ExportConfig(names="jedi")))
    # tair in degC -> K (air_temperature); qref 0..3.9 g/kg: 0..3.9e-3 kg/kg; sst stays
    # in degC (SOCA's sea_water_potential_temperature).
    for k, shift in ((2, 273.15), (0, 0.0)):
        assert loaded.input_min[k].item() == pytest.approx(
            (model.input_min[k] + shift).item(), abs=1e-4
        )
        assert loaded.input_max[k].item() == pytest.approx(
            (model.input_max[k] + shift).item(), abs=1e-4
        )
    assert loaded.input_max[11].item() == pytest.approx(3.9e-3, rel=1e-6)


def test_out_of_range_fill_and_clamp_are_the_users(tmp_path: Path) -> None:
    model = ranged_model()
    with torch.no_grad():
        model.layers[-1].bias.fill_(10.0)  # type: ignore[union-attr]  # predicts far above 1
    x = physical_inputs(model, 4)
    x[2, 0] = 9.9e19  # far outside the range, below the fill threshold
    flagged = _load(export_model(model, tmp_path / "a.pt"))
    assert flagged.row_flags(x).tolist() == [0, 0, 1, 0]
    assert (flagged.predict(x) > 1.0).all()  # flag mode: flagged, not filled; no clamp
    options = ExportConfig(clamp=True, out_of_range="fill", fill_value=-1.0)
    strict = _load(export_model(model, tmp_path / "b.pt", options))
    y = strict.predict(x)
    assert y[:, 0].tolist() == [1.0, 1.0, -1.0, 1.0]


def test_provenance_and_signature_are_inside_the_file(tmp_path: Path) -> None:
    model = ranged_model()
    state = _checkpoint(model)
    state["config"] = {"export": {"names": "jedi"}}
    torch.save(state, tmp_path / "ckpt.pt")
    path = export_checkpoint(tmp_path / "ckpt.pt", tmp_path / "model.pt")
    extra = read_extra_files(path)
    assert extra["format_version"] == "2"
    sig = json.loads(extra["signature.json"])
    assert [i["name"] for i in sig["inputs"]] == JEDI_INPUTS
    assert sig["inputs"][0]["unit"] == "degC" and sig["inputs"][2]["unit"] == "K"
    assert sig["outputs"][0]["name"] == "sea_ice_area_fraction"
    assert sig["fill_value"] == "nan" and sig["outputs"][0]["upper"] == 1.0
    origin = json.loads(extra["provenance.json"])
    assert origin["torch_version"] == torch.__version__
    assert origin["checkpoint"] == str((tmp_path / "ckpt.pt").resolve())
    assert origin["config"] == {"export": {"names": "jedi"}}
    card = (tmp_path / "model.md").read_text()
    assert card.startswith("# Model card: model.pt") and "sea_ice_area_fraction" in card


def test_describe_prints_names_units_levels_ranges_and_provenance(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export_model(ranged_model(), tmp_path / "m.pt", ExportConfig(names="jedi"))
    assert main(["export", "--describe", str(tmp_path / "m.pt")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"sea_water_potential_temperature +degC +level 0", out)
    assert "air_temperature" in out and "K      level 0" in out
    assert "trained on -4 .. 2" in out and "torch " + torch.__version__ in out
    assert "forward: NORMALISED" in out and "predict gives nan" in out


def test_describe_of_a_missing_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export", "--describe", str(tmp_path / "absent.pt")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "absent.pt" in err


def test_a_checkpoint_from_before_ranges_loads_with_no_range(tmp_path: Path) -> None:
    state: dict[str, Any] = _checkpoint(aice_model())
    for key in ("input_min", "input_max"):
        del state["model"][key]
    torch.save(state, tmp_path / "old.pt")
    model = load_checkpoint_model(tmp_path / "old.pt")
    assert (
        torch.isinf(model.input_min).all()
        and (model.row_flags(torch.full((1, 14), 1.0e19)) == 0).all()
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (ExportConfig(units={"sst": "m"}), "gives sst in 'm', but its exported name 'sst'"),
        (ExportConfig(names="jedi", units={"sst": "K"}), "gives sst in 'K', but .* degC"),
        (ExportConfig(units={"ssh": "m"}), "unit mapping names 'ssh', which the model"),
        (ExportConfig(output_levels=(0, 1)), "output_levels must have 1 entries"),
        (ExportConfig(names={"aice": "x"}), "mapping lacks 'sst'"),
    ],
)
def test_check_export_refuses_before_any_training(options: ExportConfig, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_export(ModelConfig(hidden=(4,)), options)


def test_export_cli_packages_for_aoti_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The wiring only: compiling is tested (and cached) by the cxx tests."""
    import ufsemulator.export.aoti

    calls: list[tuple[Path, Path]] = []

    def package(model_pt: Path, out: Path) -> Path:
        calls.append((Path(model_pt), Path(out)))
        return Path(out)

    monkeypatch.setattr(ufsemulator.export.aoti, "package_export", package)
    torch.save(_checkpoint(aice_model()), tmp_path / "ckpt.pt")
    argv = ["export", "--checkpoint", str(tmp_path / "ckpt.pt"), "--out", str(tmp_path / "m.pt")]
    argv.append("--trust-checkpoint")  # written by torch.save, not by a training of this user
    assert main([*argv, "--names", "jedi", "--aoti", str(tmp_path / "m.pt2")]) == 0
    assert calls == [(tmp_path / "m.pt", tmp_path / "m.pt2")]
    out = capsys.readouterr().out
    assert "names jedi" in out and "Packaged" in out and "m.pt2" in out
    assert main(["export", "--out", str(tmp_path / "x.pt")]) == 2
    assert "export needs --checkpoint and --out" in capsys.readouterr().err
