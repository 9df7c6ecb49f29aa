"""The learning rate's warm-up: from the single-rank rate to the rate scaled for the world.

With ``training.scale_lr_with_world_size`` the rate is ``lr * world_size`` (the global
batch is ``world_size`` times larger, so an epoch has that many times fewer steps). Taken
at once, the larger rate unsettles the first steps from random weights; Goyal et al. 2017
("Accurate, Large Minibatch SGD") raise it linearly from the single-rank rate over the
first epochs instead. Here over ``training.lr_warmup_epochs`` epochs of optimiser steps:
the update after ``done`` steps uses

    lr(done) = start + (peak - start) * min(done, steps) / steps

so the first update uses the single-rank rate and every update from ``steps`` on the
scaled one. The step count is the optimiser's own (checkpointed with its state), so a run
resumed in the middle of the warm-up continues it where it stopped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Warmup:
    """A linear warm-up from ``start_lr`` to ``peak_lr`` over ``steps`` optimiser steps."""

    start_lr: float
    peak_lr: float
    steps: int

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ValueError(f"warm-up steps must be >= 0, got {self.steps}")

    @classmethod
    def for_run(
        cls, lr: float, world_size: int, scaled: bool, epochs: float, steps_per_epoch: int
    ) -> Warmup:
        """The warm-up of a run: to ``lr * world_size`` where the rate is scaled (none
        where it is not, or for one rank: there is nothing to rise to)."""
        peak = lr * world_size if scaled else lr
        steps = math.ceil(epochs * steps_per_epoch) if peak != lr else 0
        return cls(start_lr=lr, peak_lr=peak, steps=steps)

    @property
    def active(self) -> bool:
        return self.steps > 0 and self.start_lr != self.peak_lr

    def lr(self, done: int) -> float:
        """The rate of the update that follows ``done`` updates."""
        if not self.active or done >= self.steps:
            return self.peak_lr
        return self.start_lr + (self.peak_lr - self.start_lr) * max(done, 0) / self.steps

    def lr_tensor(self, count: torch.Tensor) -> torch.Tensor:
        """``lr`` on the device from Adam's step count ``count`` (already raised for this
        update, so ``count - 1`` updates are done): no host sync, so a CUDA graph of the
        step captures it and every replay reads the count anew."""
        done = torch.clamp(count - 1.0, min=0.0, max=float(self.steps))
        return self.start_lr + (self.peak_lr - self.start_lr) / self.steps * done
