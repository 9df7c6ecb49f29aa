"""training.target_val_loss: a run ends, completed, at the first epoch that reaches it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.ufsemulator.training.test_training import data_dir, run_single, single_process, smoke  # noqa: F401
from ufsemulator.config import Config, ConfigError


@pytest.mark.parametrize(("target", "epochs"), [(10.0, 1), (0.0, 3)])
@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_a_run_stops_at_its_target_loss(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, target: float, epochs: int
) -> None:
    result = run_single(monkeypatch, smoke(target_val_loss=target), run_dir=tmp_path)
    assert (result.status, result.epochs_run) == ("completed", epochs)
    assert (tmp_path / "model.pt").is_file()
    saved = json.loads((tmp_path / "training_results.json").read_text())
    assert saved["config"]["training"]["target_val_loss"] == target


@pytest.mark.parametrize(("value", "ok"), [(0.01, True), ("1e-3", True), (None, True), (-1, False)])
def test_target_val_loss_is_a_number_at_least_zero(value: object, ok: bool) -> None:
    data = {"training": {"target_val_loss": value}}
    if ok:
        assert Config.from_dict(data).training.target_val_loss == (
            None if value is None else float(value)  # type: ignore[arg-type]
        )
    else:
        with pytest.raises(ConfigError, match="target_val_loss"):
            Config.from_dict(data)
