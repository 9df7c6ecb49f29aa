"""AOTInductor package of an export: the C++ path that does not need TorchScript.

``torch.export`` traces two float32 programs of the exported module, each compiled ahead
of time into native code and packaged together in one ``.pt2`` file:

- model ``predict``: ``inputs [N, n_in]`` -> ``(prediction [N, n_out], row_flags [N] int8)``
- model ``jac_physical``: ``(inputs [N, n_in], mask [N, 1])`` -> ``jacobian [N, n_out, n_in]``

N is dynamic (1 .. 2**31 - 2 rows). Both take and give float32 only (compiled code has
one dtype). The package's metadata (``get_metadata()`` in C++) holds the same
``signature.json``, ``provenance.json`` and ``format_version`` as ``model.pt``. Load it in
C++ with ``torch::inductor::AOTIModelPackageLoader(path, "jac_physical")`` or in Python
with :func:`load`. Compiling takes about a minute per program on a loaded 2-core machine.
"""

from __future__ import annotations

import os
import uuid
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

MODELS = ("predict", "jac_physical")


class _Predict(nn.Module):
    def __init__(self, module: Any) -> None:
        super().__init__()
        self.module = module

    def forward(self, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.module.predict(inputs), self.module.row_flags(inputs)


class _Jacobian(nn.Module):
    def __init__(self, module: Any) -> None:
        super().__init__()
        self.module = module

    def forward(self, inputs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.module.jac_physical(inputs, mask)


def package_model(model: nn.Module, out: str | Path, metadata: dict[str, str]) -> Path:
    """Compile ``model`` (an :class:`EmulatorMLP` prepared for export) into ``out``."""
    from torch._inductor import aot_compile
    from torch._inductor.package import package_aoti

    out = Path(out)
    n_in = int(model.n_in)  # type: ignore[arg-type]
    rows = torch.export.Dim("rows", min=1, max=2**31 - 2)
    x = torch.zeros(8, n_in)
    programs = {
        "predict": (_Predict(model), (x,), {"inputs": {0: rows}}),
        "jac_physical": (
            _Jacobian(model),
            (x, torch.ones(8, 1)),
            {"inputs": {0: rows}, "mask": {0: rows}},
        ),
    }
    options = {"aot_inductor.package": True, "aot_inductor.metadata": dict(metadata)}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_name = out.with_name(f".{out.stem}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp.pt2")
    try:
        files: dict[str, Any] = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            warnings.simplefilter("ignore", FutureWarning)  # torch's own LeafSpec notice
            for name, (wrapper, args, shapes) in programs.items():
                program = torch.export.export(wrapper.eval(), args, dynamic_shapes=shapes)
                files[name] = aot_compile(program.module(), args, options=options)
        package_aoti(str(tmp_name), files)
        os.replace(tmp_name, out)
    finally:
        Path(tmp_name).unlink(missing_ok=True)
    return out


def package_export(model_pt: str | Path, out: str | Path) -> Path:
    """The AOTInductor package of an existing ``model.pt`` (same weights, same metadata)."""
    from ufsemulator.export.torchscript import read_extra_files

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = torch.jit.load(str(model_pt))
    return package_model(python_model(scripted), out, read_extra_files(model_pt))


# What prepare_export sets on a model beyond its weights and buffers.
_ATTRIBUTES = (
    "input_names",
    "output_names",
    "input_levels",
    "output_levels",
    "input_units",
    "output_units",
    "fill_threshold",
    "fill_value",
    "land_value",
    "land_columns",
    "range_margin",
    "fill_out_of_range",
    "clamp_output",
    "output_lower",
    "output_upper",
)


def python_model(scripted: Any) -> nn.Module:
    """The :class:`EmulatorMLP` of a TorchScript export (torch.export traces Python code,
    not a ScriptModule)."""
    from ufsemulator.model.emulator import EmulatorMLP, ModelConfig

    state = scripted.state_dict()
    layers = sum(1 for key in state if key.startswith("layers.") and key.endswith(".weight"))
    widths = [int(state[f"layers.{i}.weight"].shape[0]) for i in range(layers)]
    config = ModelConfig(
        n_in=int(scripted.n_in),
        n_out=int(scripted.n_out),
        hidden=tuple(widths[:-1]),
        activation=str(scripted.activation),
        input_names=tuple(scripted.input_names),
        output_names=tuple(scripted.output_names),
        input_levels=tuple(scripted.input_levels),
        output_levels=tuple(scripted.output_levels),
    )
    model = EmulatorMLP(config)
    model.load_state_dict(state)
    for name in _ATTRIBUTES:
        value = getattr(scripted, name)
        setattr(model, name, list(value) if isinstance(value, list) else value)
    for param in model.parameters():
        param.requires_grad_(False)
    return model.eval()


def load(path: str | Path, model: str = "jac_physical") -> Any:
    """One program of a package, callable from Python (as C++ would call it)."""
    from torch._inductor.package import load_package

    return load_package(str(path), model)
