"""Adam as torch's fused kernel, without ``torch.optim`` around it.

``torch.optim.Adam(fused=True)`` runs one kernel per step (``torch._fused_adam_``), but its
first use imports ``torch._dynamo`` (the optimiser's methods are wrapped to be skipped by
``torch.compile``): 1-1.5 s on a laptop-class CPU build of torch, 3-6 s with a CUDA build,
paid by every job before its first step, for a model whose 150 epochs of steps take 1 s.
``FusedAdam`` calls the same kernel the same way (the step count raised by one, then the
kernel; the step counts float32 tensors on the parameters' device), so its arithmetic is
``torch.optim.Adam(fused=True)``'s bit for bit (a test compares them), and its checkpoint
state has the same layout, so checkpoints load into either.

Only what the loop uses is here: one parameter group, ``step``, ``zero_grad``, and the
state in and out. Where the fused kernel does not run (torch before 2.4 on a CPU),
``adam_for`` returns ``torch.optim.Adam`` instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from ufsemulator.training.warmup import Warmup

BETAS = (0.9, 0.999)
EPS = 1e-8


class FusedAdam:
    """Adam (L2 weight decay added to the gradient, as ``torch.optim.Adam``) on one group."""

    def __init__(
        self,
        params: list[nn.Parameter],
        lr: float,
        weight_decay: float,
        warmup: Warmup | None = None,
    ) -> None:
        """``warmup``: the rate of each step from the step count on the device (the
        group's ``lr`` is then the rate after the warm-up)."""
        self.warmup = warmup if warmup is not None and warmup.active else None
        self.param_groups: list[dict[str, Any]] = [
            {
                "params": params,
                "lr": lr,
                "betas": BETAS,
                "eps": EPS,
                "weight_decay": weight_decay,
                # The rest as torch.optim.Adam(fused=True) records them, for the checkpoint.
                "amsgrad": False,
                "maximize": False,
                "foreach": None,
                "capturable": False,
                "differentiable": False,
                "fused": True,
                "decoupled_weight_decay": False,
            }
        ]
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}

    @property
    def params(self) -> list[nn.Parameter]:
        params: list[nn.Parameter] = self.param_groups[0]["params"]
        return params

    @torch.no_grad()
    def step(self) -> None:
        """One Adam step of every parameter that has a gradient."""
        group = self.param_groups[0]
        params: list[torch.Tensor] = []
        grads, avgs, avg_sqs, steps = [], [], [], []
        for param in self.params:
            if param.grad is None:
                continue
            state = self.state.get(param)
            if state is None:
                state = self.state[param] = _fresh_state(param)
            params.append(param)
            grads.append(param.grad)
            avgs.append(state["exp_avg"])
            avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        if not params:
            return
        beta1, beta2 = group["betas"]
        torch._foreach_add_(steps, 1)
        lr = group["lr"] if self.warmup is None else self.warmup.lr_tensor(steps[0])
        torch._fused_adam_(
            params,
            grads,
            avgs,
            avg_sqs,
            [],
            steps,
            lr=lr,
            beta1=beta1,
            beta2=beta2,
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            amsgrad=False,
            maximize=False,
            grad_scale=None,
            found_inf=None,
        )

    def zero_grad(self, set_to_none: bool = True) -> None:
        for param in self.params:
            if param.grad is None:
                continue
            if set_to_none:
                param.grad = None
            else:
                param.grad.zero_()

    def load_full_state(self, saved: dict[str, Any], names: dict[str, nn.Parameter]) -> None:
        """Take a checkpoint's optimiser state (``fullstate.full_state``'s layout: the
        parameters by name). Raises KeyError or ValueError where it does not fit."""
        groups = saved["param_groups"]
        if len(groups) != 1:
            raise ValueError(f"{len(groups)} parameter groups, expected 1")
        for flag in ("amsgrad", "maximize", "decoupled_weight_decay"):
            if groups[0].get(flag):
                raise ValueError(f"the checkpoint's Adam has {flag}=True; this one has not")
        mine = {name for name, param in names.items() if any(param is p for p in self.params)}
        saved_names = set(groups[0]["params"])
        if saved_names != mine:
            raise ValueError(
                "the checkpoint's optimiser holds other parameters than the model: "
                f"{sorted(saved_names - mine)} only there, {sorted(mine - saved_names)} only here"
            )
        state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}
        for key, entry in saved["state"].items():
            param = names[key]
            loaded = {}
            for field in ("exp_avg", "exp_avg_sq"):
                value = entry[field]
                if value.shape != param.shape:
                    raise ValueError(
                        f"{key}.{field} has shape {tuple(value.shape)}, the parameter "
                        f"{tuple(param.shape)}"
                    )
                loaded[field] = value.to(device=param.device, dtype=param.dtype).clone()
            step = torch.as_tensor(entry["step"], dtype=torch.float32)
            loaded["step"] = step.to(param.device).clone()  # never the saved tensor itself
            state[param] = loaded
        for field in ("lr", "betas", "eps", "weight_decay"):  # as torch.optim's loader does
            self.param_groups[0][field] = groups[0][field]
        self.state = state


def _fresh_state(param: torch.Tensor) -> dict[str, torch.Tensor]:
    return {
        "step": torch.zeros((), dtype=torch.float32, device=param.device),
        "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
        "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
    }


def fused_kernel_runs(device: torch.device) -> bool:
    """Whether ``torch._fused_adam_`` runs on ``device`` (CUDA: always; CPU: torch >= 2.4):
    one step of a one-element parameter."""
    if not hasattr(torch, "_fused_adam_"):
        return False
    param = nn.Parameter(torch.zeros(1, device=device))
    param.grad = torch.zeros(1, device=device)
    try:
        FusedAdam([param], lr=1e-3, weight_decay=0.0).step()
    except (RuntimeError, NotImplementedError):
        return False
    return True
