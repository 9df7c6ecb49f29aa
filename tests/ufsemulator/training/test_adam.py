"""``FusedAdam`` is ``torch.optim.Adam(fused=True)`` without torch.optim: same bits, same
checkpoint state, and it loads a state that torch's optimiser wrote (and the reverse)."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
import torch

from ufsemulator.model.emulator import EmulatorMLP, ModelConfig
from ufsemulator.training.adam import FusedAdam, fused_kernel_runs
from ufsemulator.training.fullstate import full_state

pytestmark = pytest.mark.skipif(
    not fused_kernel_runs(torch.device("cpu")), reason="no fused Adam kernel for CPUs here"
)


def _model() -> EmulatorMLP:
    torch.manual_seed(0)
    return EmulatorMLP(ModelConfig(hidden=(16, 8)))


def _train(model: EmulatorMLP, optimizer: object, steps: int, seed: int = 1) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(32, model.config.n_in, generator=generator)
        model(x).pow(2).mean().backward()
        optimizer.step()  # type: ignore[attr-defined]
        optimizer.zero_grad(set_to_none=True)  # type: ignore[attr-defined]


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


def _through_disk(state: dict) -> dict:
    """What a checkpoint gives back (on a CPU, full_state's tensors share the live ones)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded: dict = torch.load(buffer, weights_only=True)
    return loaded


def _equal_states(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[k].keys() == b[k].keys() and all(torch.equal(a[k][f], b[k][f]) for f in a[k]) for k in a
    )


@pytest.mark.parametrize("weight_decay", [0.0, 1e-4])
@pytest.mark.parametrize("steps", [1, 7])
def test_fused_adam_takes_torch_fused_adams_steps_bit_for_bit(
    weight_decay: float, steps: int
) -> None:
    ours, theirs = _model(), _model()
    mine = FusedAdam(list(ours.parameters()), lr=3e-3, weight_decay=weight_decay)
    torchs = torch.optim.Adam(theirs.parameters(), lr=3e-3, weight_decay=weight_decay, fused=True)
    _train(ours, mine, steps)
    _train(theirs, torchs, steps)
    for (name, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    _, got_optim = full_state(ours, mine)
    _, want_optim = full_state(theirs, torchs)
    assert got_optim["param_groups"] == want_optim["param_groups"]
    assert _equal_states(got_optim["state"], want_optim["state"])
    assert all(state["step"].item() == steps for state in got_optim["state"].values())


def test_a_state_written_by_either_resumes_in_the_other_to_the_same_bits() -> None:
    first = _model()
    torchs = torch.optim.Adam(first.parameters(), lr=1e-3, weight_decay=1e-4, fused=True)
    _train(first, torchs, 3)
    model_state, optim_state = _through_disk(full_state(first, torchs))  # type: ignore[arg-type]
    resumed = _model()
    resumed.load_state_dict(model_state)
    mine = FusedAdam(list(resumed.parameters()), lr=5.0, weight_decay=0.0)  # the saved ones win
    mine.load_full_state(optim_state, dict(resumed.named_parameters()))
    assert mine.param_groups[0]["lr"] == 1e-3 and mine.param_groups[0]["weight_decay"] == 1e-4
    _train(resumed, mine, 2, seed=2)
    _train(first, torchs, 2, seed=2)
    assert _same_weights(resumed, first)
    # ... and back: ours written, torch's optimiser loads it through torch.distributed.checkpoint.
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    _, ours_saved = _through_disk(full_state(resumed, mine))  # type: ignore[arg-type]
    again = _model()
    again.load_state_dict(resumed.state_dict())
    theirs = torch.optim.Adam(again.parameters(), lr=1e-3, weight_decay=1e-4, fused=True)
    set_optimizer_state_dict(
        again, theirs, ours_saved, options=StateDictOptions(full_state_dict=True)
    )
    _train(again, theirs, 1, seed=3)
    _train(resumed, mine, 1, seed=3)
    assert _same_weights(resumed, again)


def test_a_state_that_does_not_fit_the_model_is_refused() -> None:
    model = _model()
    mine = FusedAdam(list(model.parameters()), lr=1e-3, weight_decay=0.0)
    _train(model, mine, 1)
    _, saved = full_state(model, mine)
    other = EmulatorMLP(ModelConfig(hidden=(16, 9)))
    fresh = FusedAdam(list(other.parameters()), lr=1e-3, weight_decay=0.0)
    with pytest.raises(ValueError, match="has shape"):
        fresh.load_full_state(saved, dict(other.named_parameters()))
    fewer = {**saved, "param_groups": [{**saved["param_groups"][0], "params": ["layers.0.weight"]}]}
    with pytest.raises(ValueError, match="other parameters"):
        fresh.load_full_state(fewer, dict(other.named_parameters()))
    with pytest.raises(ValueError, match=r"\['layers.0.bias', .*\] only there, \[\] only here"):
        fresh.load_full_state(saved, {})
    amsgrad = {**saved, "param_groups": [{**saved["param_groups"][0], "amsgrad": True}]}
    with pytest.raises(ValueError, match="amsgrad=True"):
        fresh.load_full_state(amsgrad, dict(other.named_parameters()))


def test_training_with_it_never_imports_torch_dynamo() -> None:
    code = (
        "import sys, torch\n"
        "from ufsemulator.training.adam import FusedAdam\n"
        "model = torch.nn.Linear(4, 2)\n"
        "opt = FusedAdam(list(model.parameters()), lr=1e-3, weight_decay=0.0)\n"
        "model(torch.ones(3, 4)).sum().backward(); opt.step(); opt.zero_grad()\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
