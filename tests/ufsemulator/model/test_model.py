"""The emulator MLP: size, normalisation, and the Jacobian a DA system consumes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from ufsemulator.data.read import INPUT_NAMES
from ufsemulator.model.emulator import ACTIVATIONS, EmulatorMLP, ModelConfig
from ufsemulator.model.normalization import Stats


def _stats(n_in: int = 14, n_out: int = 1, seed: int = 0) -> Stats:
    rng = np.random.default_rng(seed)
    return Stats(
        input_mean=rng.normal(0, 10, n_in),
        input_std=rng.uniform(0.1, 50, n_in),
        output_mean=rng.normal(0, 1, n_out),
        output_std=rng.uniform(0.2, 3, n_out),
    )


def make_model(
    activation: str = "gelu", n_out: int = 1, dtype: torch.dtype = torch.float64, seed: int = 0
) -> EmulatorMLP:
    torch.manual_seed(seed)
    config = ModelConfig(
        activation=activation,
        n_out=n_out,
        output_names=tuple(f"y{i}" for i in range(n_out)),
        output_levels=tuple(range(n_out)),
    )
    model = EmulatorMLP(config)
    model.set_normalization(_stats(n_out=n_out, seed=seed))
    return model.to(dtype).eval()


def physical_inputs(model: EmulatorMLP, n: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, model.n_in, generator=g, dtype=model.input_mean.dtype)
    return model.input_mean + model.input_std * z


def test_default_model_has_9345_parameters() -> None:
    model = EmulatorMLP()
    assert sum(p.numel() for p in model.parameters()) == 9345
    assert [tuple(layer.weight.shape) for layer in model.layers] == [  # type: ignore[arg-type]
        (64, 14),
        (64, 64),
        (64, 64),
        (1, 64),
    ]
    assert model.input_names == list(INPUT_NAMES) and model.output_names == ["aice"]
    assert model.input_levels == [0] * 14 and model.output_levels == [0]


def test_config_round_trips_through_plain_dict() -> None:
    config = ModelConfig(hidden=(32, 16), activation="tanh", output_names=("sst",))
    data = config.to_dict()
    assert json.loads(json.dumps(data)) == data  # primitives only
    assert data["hidden"] == [32, 16]
    assert ModelConfig.from_dict(data) == config


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"activation": "swish"}, "activation"),
        ({"hidden": ()}, "hidden"),
        ({"n_in": 3}, "input_names must have 3"),
        ({"output_levels": (0, 0)}, "output_levels must have 1"),
    ],
)
def test_bad_config_is_rejected(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelConfig(**kwargs)  # type: ignore[arg-type]


def test_unknown_config_key_is_named() -> None:
    with pytest.raises(ValueError, match="'hidden_sizes'"):
        ModelConfig.from_dict({"hidden_sizes": [8]})


def test_predict_is_forward_between_the_normalisations() -> None:
    model = make_model()
    x = physical_inputs(model, 16)
    x_norm = (x - model.input_mean) / model.input_std
    expected = model(x_norm) * model.output_std + model.output_mean
    # To rounding: predict sums each product in blocks of rows (batch invariance).
    torch.testing.assert_close(model.predict(x), expected, rtol=1e-13, atol=1e-13)
    assert model.predict(x).shape == (16, 1)


def test_set_normalization_checks_shapes() -> None:
    with pytest.raises(ValueError, match="input_mean has shape"):
        EmulatorMLP().set_normalization(_stats(n_in=13))


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("n_out", [1, 3])
def test_jacobian_matches_finite_differences(activation: str, n_out: int) -> None:
    model = make_model(activation, n_out)
    x = physical_inputs(model, 8)
    jac = model.jac_physical(x, None)
    assert jac.shape == (8, n_out, 14) and jac.dtype == torch.float64
    fd = torch.zeros_like(jac)
    for k in range(14):
        h = 1e-6 * float(model.input_std[k])
        step = torch.zeros_like(x)
        step[:, k] = h
        fd[:, :, k] = (model.predict(x + step) - model.predict(x - step)) / (2 * h)
    rel = (jac - fd).norm() / fd.norm()
    assert rel <= 1e-3, f"relative error {rel:.2e}"
    assert (jac - fd).abs().max() <= 1e-3 * fd.abs().max()


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_adjoint_dot_product(activation: str) -> None:
    """<J dx, dy> from jac_physical equals <dx, J^T dy> from autograd's adjoint."""
    model = make_model(activation, n_out=2)
    x = physical_inputs(model, 32)
    g = torch.Generator().manual_seed(7)
    dx = torch.randn(x.shape, generator=g, dtype=torch.float64)
    dy = torch.randn(32, 2, generator=g, dtype=torch.float64)
    jac = model.jac_physical(x, None)
    lhs = torch.sum(torch.einsum("noi,ni->no", jac, dx) * dy)
    xr = x.clone().requires_grad_(True)
    (adjoint,) = torch.autograd.grad(model.predict(xr), xr, grad_outputs=dy)
    rhs = torch.sum(dx * adjoint)
    assert abs(lhs - rhs) <= 1e-6 * max(abs(lhs.item()), abs(rhs.item()))
    # The matrix transpose is the adjoint too, per point.
    torch.testing.assert_close(torch.einsum("noi,no->ni", jac, dy), adjoint, rtol=1e-10, atol=0)


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32, torch.int64])
def test_masked_points_have_zero_jacobian(mask_dtype: torch.dtype) -> None:
    model = make_model()
    x = physical_inputs(model, 6)
    mask = torch.tensor([1, 0, 1, 1, 0, 1]).to(mask_dtype)
    full = model.jac_physical(x, None)
    jac = model.jac_physical(x, mask)
    assert (jac[[1, 4]] == 0).all()
    torch.testing.assert_close(jac[[0, 2, 3, 5]], full[[0, 2, 3, 5]], rtol=0, atol=0)
    assert (full[[1, 4]] != 0).any()


def test_non_finite_inputs_give_zero_rows_and_no_nan() -> None:
    model = make_model()
    x = physical_inputs(model, 5)
    x[1, 3] = float("nan")
    x[3, 0] = float("inf")
    jac = model.jac_physical(x, torch.ones(5, dtype=torch.bool))
    assert torch.isfinite(jac).all()
    assert (jac[[1, 3]] == 0).all() and (jac[[0, 2, 4]] != 0).any()


def test_jacobian_works_without_autograd() -> None:
    """A C++ caller typically runs under NoGradGuard / inference mode."""
    model = make_model(dtype=torch.float32)
    x = physical_inputs(model, 4)
    expected = model.jac_physical(x, None)
    with torch.inference_mode():
        torch.testing.assert_close(model.jac_physical(x, None), expected)
    with torch.no_grad():
        torch.testing.assert_close(model.jac_physical(x, None), expected)
