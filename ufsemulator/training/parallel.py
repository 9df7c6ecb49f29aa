"""How the loop's model is made parallel and optimised: GradSync (DDP for a compiled model)
or FSDP2, Adam, torch.compile, whether the training step can be a CUDA graph.

Choices for speed that leave the results as they are; docs/benchmarks.md measures them.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from hpcdist.distributed import DistContext
from ufsemulator.model.emulator import EmulatorMLP
from ufsemulator.training.adam import FusedAdam, fused_kernel_runs
from ufsemulator.training.gradreduce import LocalAllReduce, comm_hook
from ufsemulator.training.gradsync import GradSync
from ufsemulator.training.warmup import Warmup


def grouped() -> bool:
    """Whether a process group exists: a job of one process runs without one (no store,
    no communicators to start), and then nothing may call a collective."""
    return dist.is_available() and dist.is_initialized()


def wrap(
    model: EmulatorMLP,
    strategy: str,
    bucket_cap_mb: float | None,
    ctx: DistContext,
    reducer: LocalAllReduce | None = None,
    compiled: bool = False,
) -> nn.Module:
    """The model made data-parallel: ``GradSync`` (``reducer`` as its all-reduce, if given);
    DDP for a compiled model (``torch.compile`` knows DDP's buckets); FSDP2. Without a
    process group (one process), the model itself."""
    if strategy == "ddp" and not grouped():
        return model
    if strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in model.layers:
            fully_shard(layer)  # each layer's weights are gathered only while it runs
        fully_shard(model)
        return model
    if not compiled:
        return GradSync(model, reducer)
    device_ids = [ctx.device] if ctx.device.type == "cuda" else None
    # The buffers are the normalisation statistics: equal on every rank (all-reduced sums)
    # and constant, so DDP's broadcast of them before every forward is a wasted collective.
    # Its keyword was renamed in torch 2.13; the old one still works but warns there.
    names = inspect.signature(DistributedDataParallel.__init__).parameters
    key = "forward_sync_buffers" if "forward_sync_buffers" in names else "broadcast_buffers"
    options: dict[str, Any] = {key: False}
    if bucket_cap_mb is not None:  # torch < 2.4 takes no None for its default
        options["bucket_cap_mb"] = bucket_cap_mb
    ddp = DistributedDataParallel(  # its constructor imports torch._dynamo
        model,
        device_ids=device_ids,
        gradient_as_bucket_view=True,  # the gradients live in the all-reduce buffer: no copies
        **options,
    )
    if reducer is not None:
        ddp.register_comm_hook(None, comm_hook(reducer))
    return ddp


def adam(
    model: nn.Module,
    lr: float,
    weight_decay: float,
    strategy: str,
    capturable: bool = False,
    warmup: Warmup | None = None,
) -> FusedAdam | torch.optim.Adam:
    """Adam for the loop. Under ddp (DDP, ``GradSync`` or one process): torch's fused kernel,
    a third faster for a model this small (and on a GPU 2 kernels a step instead of one per
    tensor), as ``FusedAdam``, which spares the job ``torch.optim``'s import of
    ``torch._dynamo``. FSDP's DTensors, and CPUs before torch 2.4, take ``torch.optim.Adam``
    (its for-loop form). ``capturable`` (CUDA graphs) changes no arithmetic of the fused
    kernel: its step counts live on the device either way. ``warmup``: ``FusedAdam`` takes
    each step's rate from its step count; ``torch.optim.Adam``'s is set by the loop."""
    params = [p for p in model.parameters() if p.requires_grad]
    if strategy == "ddp" and fused_kernel_runs(params[0].device):
        return FusedAdam(params, lr=lr, weight_decay=weight_decay, warmup=warmup)
    return torch.optim.Adam(
        params, lr=lr, weight_decay=weight_decay, foreach=False, capturable=capturable
    )


def cuda_graph_blocker(strategy: str, compile_: bool, ctx: DistContext) -> str | None:
    """Why the training step cannot be a CUDA graph here (None: it can)."""
    if ctx.device.type != "cuda":
        return "not on a GPU"
    if strategy != "ddp":
        return f"strategy {strategy!r} (only ddp is captured)"
    if compile_:
        return "training.compile is on"
    if ctx.backend != "nccl":
        return f"backend {ctx.backend!r} (only nccl collectives can be captured)"
    if ctx.env.world_size > 1:
        version = torch.cuda.nccl.version()
        if isinstance(version, int):  # old torch: 2.9.6 is 2906
            version = (version // 1000, version // 100 % 10, version % 100)
        if tuple(version) < (2, 9, 6):
            return f"NCCL {version} cannot capture collectives (needs 2.9.6)"
    if "capture_error_mode" not in inspect.signature(torch.cuda.graph.__init__).parameters:
        return f"torch {torch.__version__} is too old (no capture_error_mode)"
    return None


def compile_model(model: EmulatorMLP, strategy: str, ctx: DistContext) -> None:
    """``torch.compile`` the model in place (state-dict keys unchanged) where it pays: on
    a GPU with Triton, under DDP. Elsewhere the model stays eager, with a note."""
    reason = None
    if ctx.device.type != "cuda":
        reason = "not on a GPU"
    elif strategy != "ddp":
        reason = f"strategy {strategy!r} (only ddp is compiled)"
    elif not hasattr(model, "compile"):
        reason = f"torch {torch.__version__} has no nn.Module.compile"
    else:
        from torch.utils._triton import has_triton

        if not has_triton():
            reason = "Triton is not installed"
    if reason is not None:
        if ctx.is_main:
            print(f"training.compile ignored: {reason}; the model runs eagerly", flush=True)
        return
    from torch import _dynamo

    _dynamo.config.suppress_errors = True  # a graph that fails to compile runs eagerly
    model.compile()


@contextlib.contextmanager
def no_sync(model: nn.Module) -> Iterator[None]:
    """Skip the gradient all-reduce of a micro-step that is not the last one."""
    if isinstance(model, DistributedDataParallel):
        with model.no_sync():
            yield
        return
    if not hasattr(model, "set_requires_gradient_sync"):  # a plain model: nothing to skip
        yield
        return
    model.set_requires_gradient_sync(False)  # type: ignore[operator]  # FSDP2
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)  # type: ignore[operator]
