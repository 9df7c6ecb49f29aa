from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from ufsemulator.config import Config, ConfigError, default_config_path, load_config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_default_config_loads_and_matches_the_packaged_file() -> None:
    config = load_config()
    assert default_config_path().is_file()
    assert config.training.batch_size == 1000
    assert config.training.strategy == "ddp"
    assert config.data.target == "aice"


def test_config_defaults_equal_the_packaged_annotated_defaults() -> None:
    # Config() is what a job gets with no config file; default.yaml is its annotated copy.
    packaged = yaml.safe_load(default_config_path().read_text())
    assert Config.from_dict(packaged) == Config() == load_config(None)
    assert _keys(packaged) == _keys(Config().to_dict())  # every default written there


def _keys(data: dict[str, Any], prefix: str = "") -> set[str]:
    keys = set()
    for key, value in data.items():
        if isinstance(value, dict):
            keys |= _keys(value, f"{prefix}{key}.")
        else:
            keys.add(f"{prefix}{key}")
    return keys


def test_user_file_is_merged_over_the_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "training:\n  epochs: 5\n  lr: 1e-3\n"))
    assert config.training.epochs == 5
    assert config.training.lr == pytest.approx(1e-3)  # YAML 1.1 reads 1e-3 as a string
    assert config.training.batch_size == load_config().training.batch_size


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("training:\n  epoch: 5\n", "unknown key 'training.epoch'"),
        ("trainig:\n  epochs: 5\n", "unknown key 'trainig'"),
        ("data:\n  synthetic: {ni: 4, nx: 3}\n", "unknown key 'data.synthetic.nx'"),
    ],
)
def test_unknown_key_is_an_error_naming_it_and_the_allowed_ones(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        load_config(write(tmp_path, text))
    assert "allowed" in str(info.value)


def test_unknown_key_lists_allowed_keys(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "training:\n  epoch: 5\n"))
    assert "epochs" in str(info.value) and "batch_size" in str(info.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("training:\n  epochs: ten\n", "'training.epochs' must be an integer, got 'ten'"),
        ("training:\n  epochs: 2.5\n", "'training.epochs' must be an integer"),
        ("training:\n  epochs: 0\n", "'training.epochs' must be >= 1"),
        ("training:\n  lr: fast\n", "'training.lr' must be a number"),
        ("training:\n  scale_lr_with_world_size: 1\n", "must be true or false"),
        ("training:\n  loss: l2\n", "'training.loss' must be one of 'mse', 'mae', 'huber'"),
        ("training:\n  strategy: zero\n", "'training.strategy' must be one of"),
        ("training:\n  val_fraction: 1.5\n", "'training.val_fraction' must be in"),
        ("model:\n  hidden_sizes: 64\n", "'model.hidden_sizes' must be a non-empty list"),
        ("model:\n  hidden_sizes: [64, x]\n", r"'model.hidden_sizes\[1\]' must be an integer"),
        ("data:\n  path: 3\n", "'data.path' must be a string"),
        ("training: 3\n", "'training' must be a mapping"),
        ("preemption:\n  signal: SIGFOO\n", "not a signal name"),
        ("- a\n- b\n", "must hold a mapping"),
    ],
)
def test_wrong_type_is_an_error_quoting_the_value(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, text))


def test_invalid_yaml_and_missing_file_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "training: [\n"))
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "absent.yaml")


def test_round_trip_through_dict_is_identity() -> None:
    config = load_config(Path(__file__).parents[2] / "ufsemulator" / "configs" / "smoke.yaml")
    assert Config.from_dict(config.to_dict()) == config
    assert config.with_epochs(7).training.epochs == 7


def test_signal_name_is_normalised() -> None:
    assert Config.from_dict({"preemption": {"signal": "USR1"}}).preemption.signal == "SIGUSR1"


def test_config_choices_match_the_data_and_model_modules() -> None:
    import typing

    from ufsemulator.config import DataConfig, ModelSection
    from ufsemulator.data.read import MASK_MODES, TARGET_NAMES
    from ufsemulator.model.emulator import ACTIVATIONS

    hints = typing.get_type_hints(DataConfig)
    assert set(typing.get_args(hints["mask"])) == set(MASK_MODES)
    assert set(typing.get_args(hints["target"])) == set(TARGET_NAMES)
    activations = typing.get_args(typing.get_type_hints(ModelSection)["activation"])
    assert set(activations) == set(ACTIVATIONS)


@pytest.mark.parametrize(
    ("section", "field", "value", "expected"),
    [
        ("data", "path", "iceh.*.nc", "iceh.*.nc"),
        ("data", "path", ["a.nc", "b.nc"], ("a.nc", "b.nc")),
        ("data", "time", -1, -1),
        ("data", "time", "2:5", "2:5"),
        ("data", "inputs", ["hi", "sst"], ("hi", "sst")),
        ("data", "atmosphere", ["atm1.nc", "atm2.nc"], ("atm1.nc", "atm2.nc")),
        ("export", "names", {"sst": "sea_surface_temperature"}, {"sst": "sea_surface_temperature"}),
        ("export", "units", "jedi", "jedi"),
        ("export", "input_levels", [0] * 14, (0,) * 14),
    ],
)
def test_data_and_export_options_are_read(
    section: str, field: str, value: object, expected: object
) -> None:
    data = {section: {field: value, **({"path": "x.nc"} if field == "atmosphere" else {})}}
    # (an atmosphere file pairs with a data.path: one is given with it)
    assert getattr(getattr(Config.from_dict(data), section), field) == expected


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"data": {"path": 3}}, "'data.path' must be a string or a list, got 3"),
        ({"data": {"time": "last"}}, "data.time must be all, INDEX or START:STOP, got 'last'"),
        ({"data": {"inputs": ["sst", "ssh"]}}, "'ssh' is not one"),
        ({"data": {"atmosphere": "atm.nc"}}, "'data.atmosphere' pairs with 'data.path'"),
        ({"export": {"names": "cf"}}, "'export.names' must be short or jedi or soca or a mapping"),
        ({"export": {"units": {"tair": 273}}}, "'export.units' must be a string or a mapping"),
    ],
)
def test_bad_data_and_export_options_are_named(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Config.from_dict(data)


@pytest.mark.parametrize("delay", [-1.0, float("inf")])
def test_test_checkpoint_delay_must_be_a_finite_number_of_seconds(delay: float) -> None:
    with pytest.raises(ConfigError, match="test_checkpoint_delay_s"):
        Config.from_dict({"training": {"test_checkpoint_delay_s": delay}})
    assert Config.from_dict({"training": {"test_checkpoint_delay_s": 0}}).training
