"""The checkpoint state built without torch.distributed.checkpoint is the same as with it."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

from ufsemulator.model.emulator import EmulatorMLP, ModelConfig
from ufsemulator.training.fullstate import full_model_state, full_state
from ufsemulator.variables import INPUT_NAMES


def _model() -> EmulatorMLP:
    torch.manual_seed(0)
    return EmulatorMLP(
        ModelConfig(
            n_in=len(INPUT_NAMES),
            input_names=INPUT_NAMES,
            input_levels=(0,) * len(INPUT_NAMES),
            hidden=(8, 8),
            activation="gelu",
            output_names=("aice",),
        )
    )


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("steps", [0, 2])
def test_full_state_matches_get_state_dict(fused: bool, steps: int) -> None:
    model = _model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-4, fused=fused)
    for _ in range(steps):
        model(torch.randn(16, len(INPUT_NAMES))).pow(2).mean().backward()
        optimizer.step()
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    want_model, want_optim = get_state_dict(model, optimizer, options=options)
    got_model, got_optim = full_state(model, optimizer)
    assert list(got_model) == list(want_model)
    assert all(torch.equal(got_model[k], want_model[k]) for k in want_model)
    assert got_optim["param_groups"] == want_optim["param_groups"]
    assert got_optim["state"].keys() == want_optim["state"].keys()
    for name, state in want_optim["state"].items():
        assert got_optim["state"][name].keys() == state.keys()
        assert all(torch.equal(got_optim["state"][name][k], v) for k, v in state.items())
    assert list(full_model_state(model)) == list(want_model)
