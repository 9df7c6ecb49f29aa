from __future__ import annotations

from pathlib import Path

import pytest

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
def test_wrong_type_is_an_error_quoting_the_value(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, text))


def test_invalid_yaml_and_missing_file_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "training: [\n"))
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "absent.yaml")


def test_round_trip_through_dict_is_identity() -> None:
    config = load_config(Path(__file__).parents[1] / "ufsemulator" / "configs" / "smoke.yaml")
    assert Config.from_dict(config.to_dict()) == config
    assert config.with_epochs(7).training.epochs == 7


def test_signal_name_is_normalised() -> None:
    assert Config.from_dict({"preemption": {"signal": "USR1"}}).preemption.signal == "SIGUSR1"


def test_config_choices_match_the_data_and_model_modules() -> None:
    import typing

    from ufsemulator.config import DataConfig, ModelSection
    from ufsemulator.data import MASK_MODES, TARGET_NAMES
    from ufsemulator.model import ACTIVATIONS

    hints = typing.get_type_hints(DataConfig)
    assert set(typing.get_args(hints["mask"])) == set(MASK_MODES)
    assert set(typing.get_args(hints["target"])) == set(TARGET_NAMES)
    activations = typing.get_args(typing.get_type_hints(ModelSection)["activation"])
    assert set(activations) == set(ACTIVATIONS)
