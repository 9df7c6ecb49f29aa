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
        (ExportConfig(names="jedi"), ["degC", "K", "degC", "kg/kg"]),  # SOCA's degC
        (ExportConfig(names="jedi", units="jedi"), ["degC", "K", "degC", "kg/kg"]),
        (ExportConfig(names="jedi", units={"tair": "kelvin"}), ["degC", "K", "degC", "kg/kg"]),
        (ExportConfig(names="short"), ["degC", "degC", "degC", "g/kg"]),
        (ExportConfig(units="native"), ["degC", "degC", "degC", "g/kg"]),
    ],
)
def test_names_carry_their_units(tmp_path: Path, options: ExportConfig, units: list[str]) -> None:
    loaded = _load(export_model(aice_model(), tmp_path / "m.pt", options))
    assert [loaded.input_units[k] for k in (0, 2, 3, 11)] == units


def test_a_background_in_the_wrong_units_is_refused_with_the_counts(tmp_path: Path) -> None:
    """What SABER does: names from the background, no units read, only jac_physical. A
    background in the right units gets the model's Jacobian; one in the wrong units (air
    temperature in degC where the name carries K, or an ocean temperature in K where
    SOCA's name carries degC) is refused by jac_physical, tlm and adjoint with the number
    of rows out of range and the input, never answered with a zero Jacobian."""
    model = ranged_model()
    x_native = physical_inputs(model, 32).double()
    x_right = jedi_inputs(model, 32)
    with torch.no_grad():
        truth = model.double().jac_physical(x_native)
        model.float()
    jedi = _load(export_model(model, tmp_path / "jedi.pt", ExportConfig(names="jedi")))
    jac = jedi.jac_physical(x_right.float(), torch.ones(32, 1))
    assert (jedi.row_flags(x_right) == 0).all() and (jac != 0).any(dim=2).all()
    assert (jac[:, 0, 0].double() - truth[:, 0, 0]).abs().max() <= 1e-4 * truth.abs().max()
    for column, shift, name in (
        (2, -273.15, "air_temperature (K) 32"),
        (0, 273.15, "sea_water_potential_temperature (degC) 32"),
    ):
        wrong = x_right.clone()
        wrong[:, column] += shift
        assert (jedi.row_flags(wrong) == 1).all()
        for method, args in (
            ("jac_physical", (wrong.float(), torch.ones(32, 1))),
            ("tlm", (wrong, torch.ones_like(wrong))),
            ("adjoint", (wrong, torch.ones(32, 1, dtype=wrong.dtype))),
        ):
            with pytest.raises(torch.jit.Error, match=rf"{method} refused: 32 of 32 rows") as info:
                getattr(jedi, method)(*args)
            assert name in str(info.value)
        assert torch.isnan(jedi.predict(wrong)).all()  # out_of_range: fill by default
        assert jedi.check_background(wrong)[name.split()[0]] == 32
    # Turned off (max_out_of_range 1): the old behaviour, zero Jacobians on flagged rows.
    quiet = ExportConfig(names="jedi", max_out_of_range=1.0)
    silent = _load(export_model(model, tmp_path / "quiet.pt", quiet))
    wrong = x_right.clone()
    wrong[:, 2] -= 273.15
    assert (silent.jac_physical(wrong.float(), torch.ones(32, 1)) == 0).all()
    # Checking units at the call (what a caller that knows them can add) names the culprit.
    sig = json.loads(read_extra_files(tmp_path / "jedi.pt")["signature.json"])
    background = {item["name"]: item["unit"] for item in sig["inputs"]}
    with pytest.raises(ValueError, match=r"air_temperature in degC .*takes K"):
        signature.check_units(sig, background | {"air_temperature": "degC"})
    signature.check_units(sig, background)


@pytest.mark.parametrize(
    ("outside", "masked", "missing", "refused"),
    [
        (1, 0, 0, False),  # 1 of 100: the limit (0.01), accepted
        (2, 0, 0, True),  # 2 of 100: refused
        (2, 1, 0, True),  # one of them masked out: 1 of 99 rows asked for, over 0.99
        (1, 1, 0, False),  # the one out of range masked out: 0 of 99
        (2, 0, 50, True),  # missing rows do not count: 2 of 50
        (1, 0, 50, True),  # 1 of 50 rows with data: 2%
    ],
)
def test_the_refusal_counts_rows_with_data_and_a_non_zero_mask(
    tmp_path: Path, outside: int, masked: int, missing: int, refused: bool
) -> None:
    model = ranged_model()
    loaded = _load(export_model(model, tmp_path / "m.pt"))
    x = model.input_mean.repeat(100, 1)
    x[99 - missing + 1 :, 0] = float("nan")
    x[:outside, 4] = 1e6  # hi far out of range
    mask = torch.ones(100, 1)
    mask[:masked] = 0.0
    counts = loaded.check_background(x, mask)
    assert counts["hi"] == outside - masked and counts["missing_rows"] == missing
    assert counts["rows_with_data"] == 100 - missing - masked
    if refused:
        with pytest.raises(
            torch.jit.Error, match=rf"{outside - masked} of {100 - missing - masked}"
        ):
            loaded.jac_physical(x, mask)
    else:
        assert loaded.jac_physical(x, mask)[:outside].abs().sum() == 0


@pytest.mark.parametrize("share", [-0.01, 1.01, "all", True])
def test_max_out_of_range_is_a_share(share: Any) -> None:
    with pytest.raises(ConfigError, match=rf"export.max_out_of_range' must be a share .*{share!r}"):
        ExportConfig(max_out_of_range=share)
    assert ExportConfig(max_out_of_range=0).max_out_of_range == 0
    assert ExportConfig(max_out_of_range=1.0).max_out_of_range == 1.0


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
    default = _load(export_model(model, tmp_path / "d.pt"))
    assert default.row_flags(x).tolist() == [0, 0, 1, 0]
    y = default.predict(x)[:, 0]  # fill by default: never an extrapolated number
    assert torch.isnan(y[2]) and (y[[0, 1, 3]] > 1.0).all()
    flagged = _load(export_model(model, tmp_path / "a.pt", ExportConfig(out_of_range="flag")))
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
    # How R^2 was measured, and what the .pt2 holds and for which CPUs.
    assert "1 - SSE/SST over the validation rows: a seeded random 0.2" in card
    assert "four float32 programs" in card and "compiled for `x86-64-v3`" in card
    assert "more than 0.01 of the rows with data are out of range" in card


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

    def package(model_pt: Path, out: Path, cpu: str = "portable") -> Path:
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


def test_a_clamped_output_has_a_zero_jacobian_and_predicts_derivative_elsewhere(
    tmp_path: Path,
) -> None:
    """With clamp: true the Jacobian is the derivative of what predict returns: 0 where
    predict clamps, central differences of predict (float64) elsewhere."""
    model = ranged_model()
    x = physical_inputs(model, 64).double()
    with torch.no_grad():
        y = model.double().predict(x)[:, 0]
        # Shift the output so a quarter of the rows predict above 1 (clamped to 1).
        shift = (1.0 - torch.quantile(y, 0.75)) / model.output_std[0]
        model.layers[-1].bias += shift  # type: ignore[operator,union-attr]
        model.float()
    free = _load(export_model(model, tmp_path / "free.pt", ExportConfig(max_out_of_range=1.0)))
    options = ExportConfig(clamp=True, max_out_of_range=1.0)
    clamped = _load(export_model(model, tmp_path / "clamped.pt", options))
    unclamped = free.predict(x)[:, 0]
    jac = clamped.jac_physical(x)
    over = unclamped > 1.0 + 1e-3
    inside = (unclamped < 1.0 - 1e-3) & (unclamped > 1e-3)
    assert int(over.sum()) >= 8 and int(inside.sum()) >= 8
    assert (jac[over] == 0).all() and (free.jac_physical(x)[over] != 0).any()
    fd = torch.zeros_like(jac)
    for k in range(x.shape[1]):
        h = 1e-4 * float(model.input_std[k])
        step = torch.zeros_like(x)
        step[:, k] = h
        fd[:, :, k] = (clamped.predict(x + step) - clamped.predict(x - step)) / (2 * h)
    scale = jac[inside].abs().amax(dim=2, keepdim=True)
    assert ((jac[inside] - fd[inside]).abs() <= 1e-6 * scale).all()


def test_nan_increments_on_rows_not_linearised_give_zero(tmp_path: Path) -> None:
    """A masked row and a missing row: tlm and adjoint answer 0 there whatever the
    increment holds, NaN included; a used row keeps its answer."""
    model = ranged_model()
    loaded = _load(export_model(model, tmp_path / "m.pt"))
    x = physical_inputs(model, 4).double()
    x[2, 0] = float("nan")  # missing
    mask = torch.tensor([[1.0], [0.0], [1.0], [1.0]])
    dx, dy = torch.ones_like(x), torch.ones(4, 1, dtype=x.dtype)
    dx[[1, 2]] = float("nan")
    dy[[1, 2]] = float("nan")
    tlm, adjoint = loaded.tlm(x, dx, mask), loaded.adjoint(x, dy, mask)
    assert tlm[[1, 2]].tolist() == [[0.0], [0.0]] and torch.isfinite(tlm).all()
    assert (adjoint[[1, 2]] == 0).all() and torch.isfinite(adjoint).all()
    assert (tlm[[0, 3]] != 0).all()
