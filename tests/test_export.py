"""TorchScript export: what the C++ data-assimilation system loads."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from ufsemulator.errors import CheckpointError
from ufsemulator.export import export_checkpoint, export_model, load_checkpoint_model
from ufsemulator.model import EmulatorMLP, ModelConfig

from .test_model import make_model, physical_inputs


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
        n_out=2, output_names=("aice", "hi"), output_levels=(0, 1),
        input_levels=tuple(range(14)), hidden=(8,), activation="silu",
    )  # fmt: skip
    loaded = _load(export_model(EmulatorMLP(config), tmp_path / "m.pt"))
    assert list(loaded.input_names) == list(config.input_names)
    assert list(loaded.output_names) == ["aice", "hi"]
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
