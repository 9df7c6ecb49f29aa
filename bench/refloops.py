"""The reference loops: plain PyTorch DDP as a tutorial writes it, timed per epoch.

Same model (EmulatorMLP, same seed), same normalised rows, same batch per rank and
Adam settings as the project's loop; only the loop differs:

- ``dataloader``: DataLoader + DistributedSampler over a TensorDataset in host memory,
  each batch copied to the device; the DESIGN.md reference.
- ``resident``: the rank's rows already on the device, a device randperm per epoch and
  an index tensor per step.

Both use DDP's and Adam's defaults and read ``loss.item()`` every step for the running
loss, as such loops do.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from hpcdist.distributed import DistContext


@dataclass(frozen=True)
class Timing:
    """One rank's timed epochs: rows it trained on, wall seconds, optimiser steps."""

    rows: int
    seconds: float
    steps: int
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. ours: CUDA graph, losses

    def as_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "seconds": self.seconds, "steps": self.steps, **self.extra}


def settle(ctx: DistContext) -> None:
    """Every queued kernel done and every rank here: the point to read a clock at."""
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
        dist.barrier(device_ids=[ctx.device.index or 0])
    else:
        dist.barrier()


def timed_epochs(
    ctx: DistContext, run_epoch: Callable[[int], tuple[int, int]], warmup: int, epochs: int
) -> Timing:
    """``run_epoch(e) -> (rows, steps)``; the epochs after ``warmup`` are timed."""
    rows = steps = 0
    seconds = 0.0
    for epoch in range(warmup + epochs):
        settle(ctx)
        start = time.perf_counter()
        epoch_rows, epoch_steps = run_epoch(epoch)
        settle(ctx)
        if epoch >= warmup:
            seconds += time.perf_counter() - start
            rows += epoch_rows
            steps += epoch_steps
    return Timing(rows, seconds, steps)


def _ddp(model: nn.Module, ctx: DistContext) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = model.to(ctx.device)
    ids = [ctx.device] if ctx.device.type == "cuda" else None
    ddp = DistributedDataParallel(model, device_ids=ids)
    return ddp, torch.optim.Adam(ddp.parameters(), lr=1e-4, weight_decay=1e-4)


def dataloader_loop(
    ctx: DistContext,
    model: nn.Module,
    x_all: torch.Tensor,
    y_all: torch.Tensor,
    batch: int,
    warmup: int,
    epochs: int,
) -> Timing:
    """``x_all``/``y_all``: the whole training set in host memory; the sampler shards it."""
    dataset = TensorDataset(x_all, y_all)
    sampler: DistributedSampler[int] = DistributedSampler(
        dataset, num_replicas=ctx.env.world_size, rank=ctx.env.rank, shuffle=True, seed=0
    )
    cuda = ctx.device.type == "cuda"
    loader = DataLoader(dataset, batch_size=batch, sampler=sampler, pin_memory=cuda)
    ddp, optimizer = _ddp(model, ctx)

    def run_epoch(epoch: int) -> tuple[int, int]:
        sampler.set_epoch(epoch)
        rows = steps = 0
        running = 0.0
        for xb, yb in loader:
            xb, yb = xb.to(ctx.device, non_blocking=True), yb.to(ctx.device, non_blocking=True)
            optimizer.zero_grad()
            loss = F.mse_loss(ddp(xb), yb)
            loss.backward()
            optimizer.step()
            running += loss.item()
            rows += xb.shape[0]
            steps += 1
        return rows, steps

    return timed_epochs(ctx, run_epoch, warmup, epochs)


def resident_loop(
    ctx: DistContext,
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    batch: int,
    warmup: int,
    epochs: int,
) -> Timing:
    """``x``/``y``: this rank's shard; moved to the device once."""
    x, y = x.to(ctx.device), y.to(ctx.device)
    n = x.shape[0]
    ddp, optimizer = _ddp(model, ctx)

    def run_epoch(epoch: int) -> tuple[int, int]:
        perm = torch.randperm(n, device=ctx.device)
        steps = 0
        running = 0.0
        for start in range(0, n, batch):
            idx = perm[start : start + batch]
            optimizer.zero_grad()
            loss = F.mse_loss(ddp(x[idx]), y[idx])
            loss.backward()
            optimizer.step()
            running += loss.item()
            steps += 1
        return n, steps

    return timed_epochs(ctx, run_epoch, warmup, epochs)
