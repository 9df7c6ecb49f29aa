"""The full (unsharded) model and optimiser state on the CPU: what a checkpoint holds.

For FSDP that is ``torch.distributed.checkpoint.state_dict.get_state_dict`` (it gathers the
shards). For a plain or DDP model every rank already holds everything, and the same
layout (parameter names as the optimiser's keys, no ``module.`` prefix) is built here
directly: importing ``torch.distributed.checkpoint`` costs most of a second of start-up
(it pulls in DTensor and sympy), which a job of a few seconds should not pay for nothing.
A test checks that both give the same dicts.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ufsemulator.training.adam import FusedAdam
from ufsemulator.training.gradsync import GradSync


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside a DDP or ``GradSync`` wrapper (the model itself otherwise)."""
    return model.module if isinstance(model, DistributedDataParallel | GradSync) else model


def sharded(model: nn.Module) -> bool:
    """Whether ``model`` holds FSDP2 shards (DTensor parameters)."""
    return any(type(p).__name__ == "DTensor" for p in model.parameters())


def full_state(
    model: nn.Module, optimizer: torch.optim.Optimizer | FusedAdam
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model state, optimiser state), full and on the CPU, keyed by parameter names.
    Collective for FSDP (every rank calls it); local otherwise."""
    if sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        assert isinstance(optimizer, torch.optim.Optimizer)  # FSDP always takes torch's Adam
        return get_state_dict(model, optimizer, options=options)
    net = unwrap(model)
    model_state = {key: _cpu(value) for key, value in net.state_dict().items()}
    names = {id(param): name for name, param in net.named_parameters()}
    state: dict[str, Any] = {}
    groups: list[dict[str, Any]] = []
    for group in optimizer.param_groups:
        keys = [names[id(param)] for param in group["params"]]
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": keys})
        for param, key in zip(group["params"], keys, strict=True):
            if param in optimizer.state:
                state[key] = {k: _cpu(v) for k, v in optimizer.state[param].items()}
    return model_state, {"state": state, "param_groups": groups}


def full_model_state(model: nn.Module) -> dict[str, Any]:
    """The full model state (on the model's device); collective for FSDP."""
    if sharded(model):
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return dict(unwrap(model).state_dict())


def _cpu(value: Any) -> Any:
    # A detached copy on the CPU (``.cpu()`` of a CPU tensor would be the tensor itself; the
    # checkpoint writer snapshots what it is given).
    return value.detach().cpu() if isinstance(value, torch.Tensor) else value
