"""Training losses and the validation metrics, summed per rank and combined after one
all-reduce."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

LossFn = Callable[..., torch.Tensor]


def loss_function(name: str, delta: float) -> LossFn:
    """The training loss named in the config (``mse``, ``mae`` or ``huber``)."""
    losses: dict[str, LossFn] = {
        "mse": F.mse_loss,
        "mae": F.l1_loss,
        "huber": functools.partial(F.huber_loss, delta=delta),
    }
    return losses[name]


@torch.no_grad()
def validation_sums(net: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn,
                    chunks: int) -> torch.Tensor:  # fmt: skip
    """This rank's sums over its validation rows (float64, on their device): loss, squared
    error, sum and sum of squares of the targets, count. Sums, so that one all-reduce
    gives the whole set's; ``val_metrics`` turns them into numbers."""
    sums = torch.zeros(5, dtype=torch.float64, device=x.device)
    for xc, yc in zip(x.tensor_split(chunks), y.tensor_split(chunks), strict=True):
        pred = net(xc).double()
        yd = yc.double()
        sums += torch.stack([
            loss_fn(pred, yd, reduction="sum"), ((pred - yd) ** 2).sum(),
            yd.sum(), (yd * yd).sum(), torch.tensor(float(yd.numel()), device=x.device),
        ])  # fmt: skip
    return sums


def val_metrics(sums: list[float]) -> tuple[float, float]:
    """(loss, R^2) of the whole validation set from the all-reduced sums."""
    loss_sum, sse, s1, s2, count = sums
    spread = s2 - s1 * s1 / count
    return loss_sum / count, 1.0 - sse / spread if spread > 0 else float("nan")
