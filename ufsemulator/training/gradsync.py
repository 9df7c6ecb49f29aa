"""Data parallelism for the emulator's small model, without DDP.

DDP's constructor imports ``torch._dynamo`` (3-6 s with a CUDA build of torch, before the
first step) and buckets gradients for overlap that a 9,345-parameter model does not need:
its 37 KB of gradients are one all-reduce after the backward pass either way.
``GradSync`` does what DDP does for such a model, in the open:

- at construction, every rank takes rank 0's parameters and buffers (one broadcast);
- the gradients live in one flat buffer (DDP's ``gradient_as_bucket_view``): at the first
  forward after ``zero_grad(set_to_none=True)`` every parameter's ``.grad`` is pointed at
  its slice of the buffer, zeroed, and autograd adds into it in place;
- ``reduce_gradients()`` after the last micro-batch's backward makes the buffer the mean
  over the ranks: divided by the world size, then summed (as DDP), by the backend's
  all-reduce or by the host-local one of ``gradreduce``;
- on a CPU the buffer has one more element, the rank's vote to stop (1 where it was asked
  to, else 0): the same all-reduce sums the votes, and the loop reads the agreement from
  the step's own exchange (``reduce_gradients`` returns it) instead of a collective of its
  own every ``check_every_steps`` (a gloo all-reduce of 32 ranks took 12 ms). A sum of
  non-negative votes is above 0 exactly when a rank voted, whatever the order of the sum.

Every rank ends a step with the same gradients and so the same weights. A CUDA graph can
hold the whole step: the zeroing, backward, the all-reduce and Adam are kernels on fixed
memory. ``torch.compile`` and FSDP keep torch's own wrappers (``parallel.wrap``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ufsemulator.training.gradreduce import LocalAllReduce


def carries_vote(device: torch.device) -> bool:
    """Whether the gradient all-reduce carries the stop votes (module docstring): on a CPU,
    where the summed vote is read without a device sync."""
    return device.type == "cpu"


class GradSync(nn.Module):
    """``module`` whose gradients ``reduce_gradients`` averages over the process group."""

    def __init__(self, module: nn.Module, reducer: LocalAllReduce | None = None) -> None:
        super().__init__()
        self.module = module
        self.reducer = reducer
        self.world = dist.get_world_size()
        params = [p for p in module.parameters() if p.requires_grad]
        dtypes = sorted({str(p.dtype) for p in params})
        if len(dtypes) != 1:
            raise ValueError(f"GradSync needs parameters of one dtype, got {dtypes or 'none'}")
        self._params = params
        numel = sum(p.numel() for p in params)
        vote = carries_vote(params[0].device)  # one more element: the stop vote, last
        self.flat = torch.zeros(numel + vote, dtype=params[0].dtype, device=params[0].device)
        self._flat_host = self.flat.numpy() if vote else None
        self._views: list[torch.Tensor] = []
        offset = 0
        for param in params:
            self._views.append(self.flat[offset : offset + param.numel()].view_as(param))
            offset += param.numel()
        _broadcast_from_rank0([*module.parameters(), *module.buffers()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._params[0].grad is None:  # dropped by zero_grad: accumulate in the buffer
            self.flat.zero_()
            for param, view in zip(self._params, self._views, strict=True):
                param.grad = view
        out: torch.Tensor = self.module(x)
        return out

    @torch.no_grad()
    def reduce_gradients(self, vote: bool = False) -> bool | None:
        """The gradients' mean over the ranks, in place (collective: every rank calls it);
        with the votes carried, whether any rank voted to stop (the same on every rank),
        else None."""
        host = self._flat_host
        if host is not None:
            host[-1] = float(vote)
        if self.reducer is not None:
            self.reducer.reduce_(self.flat)  # divides, then sums in rank order
        else:
            self.flat.div_(self.world)
            dist.all_reduce(self.flat)
        return None if host is None else bool(host[-1] > 0)


def reduce_gradients(model: nn.Module, vote: bool = False) -> bool | None:
    """``model.reduce_gradients(vote)`` for a ``GradSync``; None for any other model (a
    single process, or DDP and FSDP, which reduce during the backward pass)."""
    if isinstance(model, GradSync):
        return model.reduce_gradients(vote)
    return None


@torch.no_grad()
def _broadcast_from_rank0(tensors: list[torch.Tensor]) -> None:
    """Rank 0's values of ``tensors`` on every rank: one broadcast per dtype."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for tensor in tensors:
        by_dtype.setdefault(tensor.dtype, []).append(tensor)
    for group in by_dtype.values():
        flat = torch.cat([t.detach().reshape(-1) for t in group])
        dist.broadcast(flat, src=0)
        offset = 0
        for tensor in group:
            tensor.copy_(flat[offset : offset + tensor.numel()].view_as(tensor))
            offset += tensor.numel()
