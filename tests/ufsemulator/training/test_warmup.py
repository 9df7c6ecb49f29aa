"""The learning rate's warm-up: its rate step by step, on the host and on the device, in
``FusedAdam``, and continued by a resumed run."""

from __future__ import annotations

import io

import pytest
import torch

from tests.ufsemulator.training.test_adam import _model, _same_weights, _train
from ufsemulator.config import ConfigError, TrainingConfig
from ufsemulator.training.adam import FusedAdam, fused_kernel_runs
from ufsemulator.training.fullstate import full_state
from ufsemulator.training.warmup import Warmup

WARMUP = Warmup(start_lr=1e-4, peak_lr=4e-4, steps=10)


@pytest.mark.parametrize(
    ("done", "lr"),
    [
        (0, 1e-4),  # the first update: the single-rank rate
        (1, 1.3e-4),
        (5, 2.5e-4),
        (9, 3.7e-4),  # the last update of the warm-up
        (10, 4e-4),  # from here on: the scaled rate
        (11, 4e-4),
        (10_000, 4e-4),
    ],
)
def test_rate_rises_linearly_from_the_single_rank_rate(done: int, lr: float) -> None:
    assert WARMUP.lr(done) == pytest.approx(lr, rel=1e-12)


def test_rate_on_the_device_is_the_hosts() -> None:
    # Adam raises its count before the update: count k is the update after k - 1.
    for count in range(1, 14):
        on_device = WARMUP.lr_tensor(torch.tensor(float(count))).item()
        assert on_device == pytest.approx(WARMUP.lr(count - 1), rel=1e-6)


@pytest.mark.parametrize(
    ("world", "scaled", "epochs", "expected"),
    [
        (4, True, 1.0, Warmup(1e-4, 4e-4, 50)),
        (4, True, 0.5, Warmup(1e-4, 4e-4, 25)),
        (4, True, 0.01, Warmup(1e-4, 4e-4, 1)),  # part of a step: one step
        (4, True, 0.0, Warmup(1e-4, 4e-4, 0)),  # the scaled rate from the first step
        (4, False, 1.0, Warmup(1e-4, 1e-4, 0)),  # nothing to rise to
        (1, True, 1.0, Warmup(1e-4, 1e-4, 0)),
    ],
)
def test_a_runs_warmup_follows_its_world_and_config(
    world: int, scaled: bool, epochs: float, expected: Warmup
) -> None:
    warmup = Warmup.for_run(1e-4, world, scaled, epochs, steps_per_epoch=50)
    assert warmup == expected
    assert warmup.active == (expected.steps > 0)
    assert warmup.lr(0) == (1e-4 if warmup.active else expected.peak_lr)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_warmup_epochs_must_be_a_number_from_zero(bad: float) -> None:
    with pytest.raises(ConfigError, match=r"'training\.lr_warmup_epochs' must be a number >= 0"):
        TrainingConfig(lr_warmup_epochs=bad)
    assert TrainingConfig(lr_warmup_epochs=0.0).lr_warmup_epochs == 0.0


needs_fused = pytest.mark.skipif(
    not fused_kernel_runs(torch.device("cpu")), reason="no fused Adam kernel for CPUs here"
)


class _Stepped(FusedAdam):
    """FusedAdam without a warm-up whose rate the test sets before every step."""

    def __init__(self, model: torch.nn.Module, rates: list[float]) -> None:
        super().__init__(list(model.parameters()), lr=rates[0], weight_decay=1e-4)
        self.rates = rates
        self.done = 0

    def step(self) -> None:
        self.param_groups[0]["lr"] = self.rates[self.done]
        super().step()
        self.done += 1


@needs_fused
def test_fused_adam_takes_each_steps_warmup_rate() -> None:
    warmed, stepped = _model(), _model()
    rates = [WARMUP.lr(k) for k in range(14)]
    _train(warmed, FusedAdam(list(warmed.parameters()), 4e-4, 1e-4, warmup=WARMUP), 14)
    _train(stepped, _Stepped(stepped, rates), 14)
    for a, b in zip(warmed.parameters(), stepped.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)
    unwarmed = _model()
    _train(unwarmed, FusedAdam(list(unwarmed.parameters()), 4e-4, 1e-4), 14)
    assert not _same_weights(warmed, unwarmed)


@needs_fused
@pytest.mark.parametrize("stopped_at", [3, 10, 12])  # mid warm-up, at its end, after it
def test_a_resumed_run_continues_the_warmup(stopped_at: int) -> None:
    whole = _model()
    _train(whole, FusedAdam(list(whole.parameters()), 4e-4, 1e-4, warmup=WARMUP), 14)
    first = _model()
    optimizer = FusedAdam(list(first.parameters()), 4e-4, 1e-4, warmup=WARMUP)
    _train(first, optimizer, stopped_at)
    model_state, optim_state = full_state(first, optimizer)
    buffer = io.BytesIO()
    torch.save({"model": model_state, "optimizer": optim_state}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    resumed = _model()
    resumed.load_state_dict(saved["model"])
    again = FusedAdam(list(resumed.parameters()), 4e-4, 1e-4, warmup=WARMUP)
    again.load_full_state(saved["optimizer"], dict(resumed.named_parameters()))
    counts = {float(state["step"]) for state in again.state.values()}
    assert counts == {float(stopped_at)}  # the step count came back with the state
    # The rest of the batches, as the uninterrupted run drew them.
    generator = torch.Generator().manual_seed(1)
    for step in range(14):
        x = torch.randn(32, resumed.config.n_in, generator=generator)
        if step < stopped_at:
            continue
        resumed(x).pow(2).mean().backward()
        again.step()
        again.zero_grad(set_to_none=True)
    assert _same_weights(whole, resumed)
