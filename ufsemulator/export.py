"""TorchScript export of the emulator, for the C++ data-assimilation system.

The exported module has ``forward`` (normalised space), ``predict`` and
``jac_physical(inputs, mask)`` (physical units), and carries ``input_names``,
``output_names``, ``input_levels``, ``output_levels`` and ``activation`` as attributes.
Load it in C++ with ``torch::jit::load`` or in Python with ``torch.jit.load``.
"""

from __future__ import annotations

import copy
import os
import uuid
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ufsemulator.errors import CheckpointError
from ufsemulator.model import EmulatorMLP, ModelConfig

# Prefixes a wrapped model adds to its state_dict keys (DDP, torch.compile).
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def export_model(model: EmulatorMLP, out: str | Path) -> Path:
    """Script a copy of ``model`` (eval mode, on the CPU) and save it atomically at ``out``."""
    out = Path(out)
    model = copy.deepcopy(model).cpu().eval()
    with warnings.catch_warnings():
        # torch >= 2.10 marks TorchScript deprecated; libtorch's C++ loader still needs it.
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = torch.jit.script(model)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_name = out.with_name(f".{out.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.jit.save(scripted, str(tmp_name))
        os.replace(tmp_name, out)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return out


def load_checkpoint_model(checkpoint: str | Path) -> EmulatorMLP:
    """The model of a training checkpoint (``"model"`` state_dict + ``"model_config"``)."""
    path = Path(checkpoint)
    if not path.is_file():
        raise CheckpointError(f"checkpoint '{path}' does not exist or is not a file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises RuntimeError, UnpicklingError, EOFError, ...
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"cannot load checkpoint '{path}' (truncated or not a torch checkpoint?): {reason}"
        ) from exc
    if not isinstance(state, Mapping):
        raise CheckpointError(
            f"checkpoint '{path}' holds a {type(state).__name__}, expected a dict"
        )
    missing = [key for key in ("model", "model_config") if key not in state]
    if missing:
        raise CheckpointError(
            f"checkpoint '{path}' lacks {', '.join(repr(k) for k in missing)}; "
            f"keys: {', '.join(map(str, state))}"
        )
    if not isinstance(state["model_config"], Mapping):
        raise CheckpointError(f"'model_config' in checkpoint '{path}' is not a dict")
    try:
        config = ModelConfig.from_dict(state["model_config"])
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"bad 'model_config' in checkpoint '{path}': {exc}") from exc
    model = EmulatorMLP(config)
    try:
        model.load_state_dict(_unwrap(state["model"]))
    except (RuntimeError, TypeError, AttributeError) as exc:
        raise CheckpointError(
            f"'model' weights in checkpoint '{path}' do not fit its model_config: {exc}"
        ) from exc
    return model.eval()


def export_checkpoint(checkpoint: str | Path, out: str | Path) -> Path:
    """Export the model of a training checkpoint as TorchScript at ``out``."""
    return export_model(load_checkpoint_model(checkpoint), out)


def _unwrap(state_dict: Any) -> Any:
    if not isinstance(state_dict, Mapping):
        return state_dict
    for prefix in _WRAPPER_PREFIXES:
        if state_dict and all(str(k).startswith(prefix) for k in state_dict):
            state_dict = {str(k)[len(prefix) :]: v for k, v in state_dict.items()}
    return state_dict
