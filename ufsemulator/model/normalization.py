"""Normalisation statistics over the whole training set, also when it is sharded.

Each rank sums its shard in float64 and an ``all_reduce`` callable adds the sums across
ranks, so every rank ends with the same statistics, equal (to rounding) to those of one
process holding all the data. Two reductions are made: counts and sums give the mean,
then sums of squared deviations from that mean give the variance. That costs one more
tiny all-reduce than (count, sum, sum of squares) and avoids its cancellation when the
mean is large against the spread (a temperature in kelvin, a salinity near 35).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

FloatArray = npt.NDArray[np.float64]
AllReduce = Callable[[FloatArray], FloatArray]

# A (near-)constant column is left unscaled instead of blown up.
MIN_STD = 1.0e-6


@dataclass(frozen=True, eq=False)
class Stats:
    input_mean: FloatArray  # [n_in] float64
    input_std: FloatArray  # [n_in]
    output_mean: FloatArray  # [n_out]
    output_std: FloatArray  # [n_out]

    def __post_init__(self) -> None:
        for name in ("input_mean", "input_std", "output_mean", "output_std"):
            value = np.asarray(getattr(self, name), dtype=np.float64).reshape(-1)
            object.__setattr__(self, name, value)
        if self.input_mean.shape != self.input_std.shape:
            raise ValueError(
                f"input mean and std differ in shape: {self.input_mean.shape} vs "
                f"{self.input_std.shape}"
            )
        if self.output_mean.shape != self.output_std.shape:
            raise ValueError(
                f"output mean and std differ in shape: {self.output_mean.shape} vs "
                f"{self.output_std.shape}"
            )


def stats_from_shard(
    inputs: npt.ArrayLike | torch.Tensor,
    targets: npt.ArrayLike | torch.Tensor,
    all_reduce: AllReduce | None = None,
) -> Stats:
    """Mean and (population) std of inputs ``[n, n_in]`` and targets ``[n, n_out]``.

    ``all_reduce`` sums a float64 vector over ranks and returns the sum (on every rank);
    it is called twice, in the same order on every rank. ``None`` means one process.
    Standard deviations <= 1e-6 become 1.
    """
    x = _as_2d_float64(inputs, "inputs")
    y = _as_2d_float64(targets, "targets")
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"inputs have {x.shape[0]} rows but targets {y.shape[0]}")
    reduce = all_reduce if all_reduce is not None else _identity
    n_in = x.shape[1]

    sums = _reduced(reduce, np.concatenate([[x.shape[0]], x.sum(0), y.sum(0)]))
    count = sums[0]
    if count < 1:
        raise ValueError("cannot compute normalisation statistics from zero samples")
    mean = sums[1:] / count
    x_mean, y_mean = mean[:n_in], mean[n_in:]
    squares = np.concatenate([((x - x_mean) ** 2).sum(0), ((y - y_mean) ** 2).sum(0)])
    std = np.sqrt(_reduced(reduce, squares) / count)
    std = np.where(std <= MIN_STD, 1.0, std)
    return Stats(input_mean=x_mean, input_std=std[:n_in], output_mean=y_mean, output_std=std[n_in:])


def torch_all_reduce(device: torch.device | str = "cpu") -> AllReduce:
    """An ``all_reduce`` for :func:`stats_from_shard` over the default process group.

    ``device`` must suit the backend: a CUDA device for NCCL, the CPU for gloo.
    """
    import torch.distributed as dist

    def reduce(vector: FloatArray) -> FloatArray:
        tensor = torch.from_numpy(np.array(vector, dtype=np.float64)).to(device)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor.cpu().numpy()

    return reduce


def _reduced(reduce: AllReduce, vector: FloatArray) -> FloatArray:
    out = np.asarray(reduce(np.ascontiguousarray(vector, dtype=np.float64)), dtype=np.float64)
    if out.shape != vector.shape:
        raise ValueError(f"all_reduce returned shape {out.shape}, expected {vector.shape}")
    return out


def _identity(vector: FloatArray) -> FloatArray:
    return vector


def _as_2d_float64(values: Any, name: str) -> FloatArray:
    if isinstance(values, torch.Tensor):
        values = values.detach().to("cpu", torch.float64).numpy()
    array = np.asarray(values, dtype=np.float64)
    if array.ndim == 1:
        array = array[:, None]
    if array.ndim != 2:
        raise ValueError(f"{name} must be [n, features], got shape {array.shape}")
    return array


def input_range(
    inputs: torch.Tensor, grouped: bool = False, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The smallest and largest value of each column of ``inputs`` ``[n, n_in]`` over all
    ranks (``grouped``: one MAX all-reduce of 2 n_in numbers over the default process
    group, on ``device``, which must suit the backend), as float64 on the CPU: the
    training range an export stores."""
    x = inputs
    if x.shape[0]:
        # In the inputs' own precision: a max is one of the values, exact in float64 after.
        both = torch.cat([x.amax(0), -x.amin(0)]).to(torch.float64)
    else:  # a rank without training rows leaves the range to the others
        both = torch.full((2 * x.shape[1],), -torch.inf, dtype=torch.float64, device=x.device)
    if grouped:
        import torch.distributed as dist

        both = both.to(device if device is not None else x.device)
        dist.all_reduce(both, op=dist.ReduceOp.MAX)
    both = both.cpu()
    n_in = x.shape[1]
    return -both[n_in:], both[:n_in]
