"""AOTInductor package of an export: the C++ path that does not need TorchScript.

``torch.export`` traces four float32 programs of the exported module, each compiled ahead
of time into native code and packaged together in one ``.pt2`` file:

- model ``predict``: ``inputs [N, n_in]`` -> ``(prediction [N, n_out], row_flags [N] int8)``
- model ``jac_physical``: ``(inputs [N, n_in], mask [N, 1])`` -> ``jacobian [N, n_out, n_in]``
- model ``tlm``: ``(inputs [N, n_in], dx [N, n_in], mask [N, 1])`` -> ``[N, n_out]``
- model ``adjoint``: ``(inputs [N, n_in], dy [N, n_out], mask [N, 1])`` -> ``[N, n_in]``

Each runs on one thread whatever the caller sets (more made the Jacobian slower). N is
dynamic (0 .. 2**31 - 2 rows); every input must be float32, 2-D, C-contiguous, with
its stated column count and as many rows as ``inputs``. The package checks that itself on
every call, whoever calls it (torch's own input checks, compiled in and switched on: torch
leaves them off unless the caller sets ``AOTI_RUNTIME_CHECK_INPUTS=1``; and a check that
every argument has the rows of ``inputs``, which torch does not make: a 0-row mask beside
N-row inputs would read past it), and throws a ``std::runtime_error`` naming the input and
what it expected. ``jac_physical``, ``tlm`` and ``adjoint`` throw too when more than the
export's ``max_out_of_range`` of the rows with data are out of range. :func:`load`
(Python) and the C++ example check the shapes before calling, with a clearer message, and
make a contiguous copy of a strided input (cheap next to the call) instead of refusing it.

The package's metadata (``get_metadata()`` in C++) holds the same ``signature.json``,
``provenance.json`` and ``format_version`` as ``model.pt``, and what CPU it needs:
``cpu_target`` (``portable``, the default: ``-march=x86-64-v3`` and 256-bit AVX2 vectors,
any x86-64 CPU with AVX2 and FMA; ``host``: ``-march=native`` and the widest vectors of
``compiled_on_cpu``, the machine that compiled it), ``cpu_isa`` and ``cpu_march``; a CPU
without them stops with an illegal instruction. Load it in C++ with
``torch::inductor::AOTIModelPackageLoader(path, "jac_physical")`` or in Python with
:func:`load`. Compiling takes about a minute per program on a loaded 2-core machine.
"""

from __future__ import annotations

import contextlib
import os
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

MODELS = ("predict", "jac_physical", "tlm", "adjoint")
# The gate torch compiles around its input checks, and what it becomes here.
_GATE = "const static bool result = env_var_value != nullptr && env_var_value[0] != '0';"
_ALWAYS = "const static bool result = true;"


class _Predict(nn.Module):
    def __init__(self, module: Any) -> None:
        super().__init__()
        self.module = module

    def forward(self, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # All blocks at once (by_block False): torch.export cannot trace a loop over a
        # dynamic count; each block is still its own product, so rows stay batch-invariant.
        return self.module._predict(inputs, False), self.module.row_flags(inputs)


class _Jacobian(nn.Module):
    def __init__(self, module: Any) -> None:
        super().__init__()
        self.module = module

    def forward(self, inputs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.module._jacobian(inputs, mask, False)


class _Tlm(nn.Module):
    def __init__(self, module: Any) -> None:
        super().__init__()
        self.module = module

    def forward(self, inputs: torch.Tensor, dx: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.module._tlm(inputs, dx, mask, False)


class _Adjoint(nn.Module):
    def __init__(self, module: Any) -> None:
        super().__init__()
        self.module = module

    def forward(self, inputs: torch.Tensor, dy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.module._adjoint(inputs, dy, mask, False)


@dataclass(frozen=True)
class Argument:
    """One input of a program: its name and its number of columns."""

    name: str
    columns: int


def arguments(model: str, n_in: int, n_out: int) -> tuple[Argument, ...]:
    """The inputs of one program of the package, in order."""
    inputs, mask = Argument("inputs", n_in), Argument("mask", 1)
    table = {
        "predict": (inputs,),
        "jac_physical": (inputs, mask),
        "tlm": (inputs, Argument("dx", n_in), mask),
        "adjoint": (inputs, Argument("dy", n_out), mask),
    }
    if model not in table:
        raise ValueError(f"an AOTInductor package has programs {', '.join(MODELS)}, not {model!r}")
    return table[model]


def _programs(model: nn.Module) -> dict[str, tuple[nn.Module, tuple[torch.Tensor, ...], Any]]:
    n_in, n_out = int(model.n_in), int(model.n_out)  # type: ignore[arg-type]
    rows = torch.export.Dim("rows", min=0, max=2**31 - 2)
    wrappers = {"predict": _Predict, "jac_physical": _Jacobian, "tlm": _Tlm, "adjoint": _Adjoint}
    programs = {}
    for name, wrapper in wrappers.items():
        # Rows for three blocks: an example of one block would fix the count of blocks at 1.
        args = tuple(torch.ones(600, a.columns) for a in arguments(name, n_in, n_out))
        shapes = tuple({0: rows} for _ in args)
        programs[name] = (wrapper(model).eval(), args, shapes)
    return programs


# What the compiled code may use: "portable" any x86-64 CPU with AVX2 and FMA (x86-64-v3,
# Haswell and later; the Jacobian has the same bits as with AVX-512), "host" every
# extension of the compiling machine (-march=native, its widest vectors).
CPU_TARGETS = ("portable", "host")
PORTABLE_MARCH, PORTABLE_SIMDLEN = "x86-64-v3", 256


def package_model(
    model: nn.Module, out: str | Path, metadata: dict[str, str], cpu: str = "portable"
) -> Path:
    """Compile ``model`` (an :class:`EmulatorMLP` prepared for export) into ``out``, for
    the CPUs ``cpu`` names (:data:`CPU_TARGETS`)."""
    from torch._inductor import aot_compile
    from torch._inductor import config as inductor_config
    from torch._inductor.package import package_aoti

    if cpu not in CPU_TARGETS:
        raise ValueError(f"--aoti-cpu must be {' or '.join(CPU_TARGETS)}, got {cpu!r}")
    out = Path(out)
    target: dict[str, Any] = {"cpp.march": PORTABLE_MARCH, "cpp.simdlen": PORTABLE_SIMDLEN}
    if cpu == "host":
        target = {"cpp.march": None, "cpp.simdlen": None}
    # One thread, whatever the caller's: more made the Jacobian slower (its blocks are too
    # small to share), and the refusal's throw must not leave an OpenMP region (that is
    # std::terminate, not an exception the caller gets).
    target["cpp.threads"] = 1
    options: dict[str, Any] = {
        "aot_inductor.package": True,
        # Checks of 0- and 1-row inputs would refuse them (torch assumes >= 2 rows there).
        "aot_inductor.check_lowerbound": False,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_name = out.with_name(f".{out.stem}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp.pt2")
    try:
        files: dict[str, Any] = {}
        with warnings.catch_warnings(), _checks_always_on(), inductor_config.patch(target):
            options["aot_inductor.metadata"] = {**metadata, **_target(cpu)}
            warnings.simplefilter("ignore", UserWarning)
            warnings.simplefilter("ignore", FutureWarning)  # torch's own LeafSpec notice
            for name, (wrapper, args, shapes) in _programs(model).items():
                program = _export(wrapper, args, shapes)
                files[name] = aot_compile(program.module(), args, options=options)
        package_aoti(str(tmp_name), files)
        os.replace(tmp_name, out)
    finally:
        Path(tmp_name).unlink(missing_ok=True)
    return out


def _target(cpu: str) -> dict[str, str]:
    """What CPU the compiled code needs: the vector ISA torch picks (``pick_vec_isa``,
    256-bit AVX2 for a portable package) and the -march it compiles with."""
    from torch._inductor import config
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cpu_target": cpu,
        "cpu_isa": str(pick_vec_isa()) or "none",
        "cpu_march": config.cpp.march or "native",
        "compiled_on_cpu": model,
    }


def _export(wrapper: nn.Module, args: tuple[torch.Tensor, ...], shapes: Any) -> Any:
    """torch.export of one program for any number of rows: sizes of 0 or 1 (one block, no
    padding) are not special cases (torch would otherwise fix them as it found them)."""
    from torch.fx.experimental import _config

    with _config.patch(backed_size_oblivious=True):  # type: ignore[attr-defined]
        return torch.export.export(wrapper, args, dynamic_shapes=shapes)


# Run before torch's own checks (which read sizes without looking at the dimension count):
# every argument 2-D with one row per point, as many rows as the first. torch checks each
# argument alone, so a 0-row mask beside N-row inputs passed and the kernels read past it.
_ROWS_CHECK = """
{
    int64_t rows = -1;
    for (int k = 0; k < %(count)d; ++k) {
        int64_t dim = 0;
        AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_get_dim(input_handles[k], &dim));
        if (dim != 2) {
            std::stringstream ss;
            ss << "input_handles[" << k << "]: expected a 2-D tensor [rows, columns], got "
               << dim << " dimensions\\n";
            throw std::runtime_error(std::move(ss).str());
        }
        const int64_t got = ConstantHandle(input_handles[k]).sizes()[0];
        if (k == 0) rows = got;
        if (got != rows) {
            std::stringstream ss;
            ss << "input_handles[" << k << "]: " << got << " rows, but input_handles[0] has "
               << rows << ": every argument takes one row per point\\n";
            throw std::runtime_error(std::move(ss).str());
        }
    }
}
"""


@contextlib.contextmanager
def _checks_always_on() -> Iterator[None]:
    """Compile torch's input checks (dtype, sizes, strides, device) switched on for good,
    not only under ``AOTI_RUNTIME_CHECK_INPUTS=1``: SABER sets no such variable; and before
    them a check that every argument is 2-D with the rows of the first (:data:`_ROWS_CHECK`).
    Fails the packaging, rather than ship an unchecked package, if torch's generated code
    changed."""
    from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
    from torch._inductor.virtualized import V

    original = CppWrapperCpu.generate_input_output_runtime_checks
    seen: list[str] = []

    def generate(self: Any) -> None:
        splice, writeline = self.prefix.splice_aot, self.prefix.writeline_aot

        def patched(code: Any, strip: bool = False) -> None:
            if isinstance(code, str) and _GATE in code:
                code = code.replace(_GATE, _ALWAYS)
                seen.append("gate")
            splice(code, strip)

        def first_check(line: Any) -> None:
            if line == "check_input_0(input_handles);":
                splice(_ROWS_CHECK % {"count": len(V.graph.graph_inputs)})
                seen.append("rows")
            writeline(line)

        self.prefix.splice_aot, self.prefix.writeline_aot = patched, first_check
        try:
            original(self)
        finally:
            del self.prefix.splice_aot, self.prefix.writeline_aot

    CppWrapperCpu.generate_input_output_runtime_checks = generate  # type: ignore[method-assign]
    try:
        yield
    finally:
        CppWrapperCpu.generate_input_output_runtime_checks = original  # type: ignore[method-assign]
    if "gate" not in seen or "rows" not in seen:
        raise RuntimeError(
            f"torch {torch.__version__} no longer generates the AOTInductor input checks this "
            "export switches on; the package would not check its inputs"
        )


def package_export(model_pt: str | Path, out: str | Path, cpu: str = "portable") -> Path:
    """The AOTInductor package of an existing ``model.pt`` (same weights, same metadata),
    compiled for the CPUs ``cpu`` names (portable: x86-64-v3; host: this machine's)."""
    from ufsemulator.export.torchscript import read_extra_files

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = torch.jit.load(str(model_pt))
    return package_model(python_model(scripted), out, read_extra_files(model_pt), cpu)


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
    "max_out_of_range",
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


def load(path: str | Path, model: str = "jac_physical") -> Program:
    """One program of a package, callable from Python as C++ calls it, with its inputs
    checked first (:class:`Program`)."""
    import json

    from torch._inductor.package import load_package

    runner = load_package(str(path), model)
    signature = json.loads(runner.loader.get_metadata().get("signature.json") or "{}")
    n_in, n_out = len(signature.get("inputs", [])), len(signature.get("outputs", []))
    return Program(runner, model, arguments(model, n_in, n_out))


class Program:
    """A program of a package. A call checks each input (float32, 2-D, its number of
    columns, as many rows as ``inputs``) and refuses one that does not fit with a
    ValueError naming it and what was expected; a non-contiguous one is copied."""

    def __init__(self, runner: Any, model: str, args: tuple[Argument, ...]) -> None:
        self.runner, self.model, self.args = runner, model, args
        self.loader = runner.loader

    def __call__(self, *tensors: torch.Tensor) -> Any:
        if len(tensors) != len(self.args):
            names = ", ".join(a.name for a in self.args)
            raise ValueError(f"{self.model} takes ({names}), got {len(tensors)} tensors")
        rows = tensors[0].shape[0] if tensors[0].dim() == 2 else -1
        checked = [
            _checked(self.model, a, t, rows) for a, t in zip(self.args, tensors, strict=True)
        ]
        return self.runner(*checked)


def _checked(model: str, arg: Argument, tensor: torch.Tensor, rows: int) -> torch.Tensor:
    where = f"{model}: {arg.name}"
    if tensor.dtype != torch.float32:
        raise ValueError(f"{where} must be float32 (the package's only dtype), got {tensor.dtype}")
    if tensor.device.type != "cpu":
        raise ValueError(f"{where} must be on the CPU, got {tensor.device}")
    if tensor.dim() != 2 or tensor.shape[1] != arg.columns or tensor.shape[0] != rows:
        raise ValueError(
            f"{where} must be [{max(rows, 0) if rows >= 0 else 'N'}, {arg.columns}], "
            f"got {list(tensor.shape)}"
        )
    return tensor.contiguous()
