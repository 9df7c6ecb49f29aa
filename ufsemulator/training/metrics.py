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
def validation_sums(
    net: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn, chunks: int
) -> torch.Tensor:
    """This rank's sums over its validation rows (float64, on their device): loss, squared
    error, sum and sum of squares of the targets, count. Sums, so that one all-reduce
    gives the whole set's; ``val_metrics`` turns them into numbers. Nothing here waits
    for the device: the caller reads the sums once."""
    sums = torch.zeros(5, dtype=torch.float64, device=x.device)
    for xc, yc in zip(x.tensor_split(chunks), y.tensor_split(chunks), strict=True):
        pred = net(xc).double()
        yd = yc.double()
        sums += torch.stack(
            [
                loss_fn(pred, yd, reduction="sum"),
                ((pred - yd) ** 2).sum(),
                yd.sum(),
                (yd * yd).sum(),
                # A fill on the device: torch.tensor(count, device=...) would copy from
                # the host, a synchronisation per chunk.
                yd.new_full((), float(yd.numel())),
            ]
        )
    return sums


def val_metrics(sums: list[float]) -> tuple[float, float]:
    """(loss, R^2) of the whole validation set from the all-reduced sums."""
    loss_sum, sse, s1, s2, count = sums
    spread = s2 - s1 * s1 / count
    return loss_sum / count, 1.0 - sse / spread if spread > 0 else float("nan")


class TrainSums:
    """The epoch's training loss sum and row count so far, this rank's.

    The step adds its loss into a view of a device tensor made once (no indexing op and no
    host sync per step) and counts its rows on the host (no kernel per step); ``fold``
    moves the rows into the tensor when someone reads it."""

    def __init__(self, device: torch.device) -> None:
        self.sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, rows
        self.loss = self.sums[0]
        self.rows = 0

    def fold(self) -> torch.Tensor:
        """The sums, rows included (integers: exact in float64, in any grouping)."""
        if self.rows:
            self.sums[1].add_(self.rows)
            self.rows = 0
        return self.sums

    def reset(self, values: tuple[float, float] = (0.0, 0.0)) -> None:
        """Start from ``values`` (a resumed epoch's sums, or nothing)."""
        self.rows = 0
        if values == (0.0, 0.0):
            self.sums.zero_()
        else:
            self.sums.copy_(torch.tensor(values, dtype=torch.float64))
