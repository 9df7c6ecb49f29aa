"""TorchScript export of the emulator, for the C++ data-assimilation system.

The exported module has ``predict``, ``row_flags``, ``jac_physical(inputs, mask)``,
``tlm(inputs, dx)`` and ``adjoint(inputs, dy)`` in physical units, and ``forward`` in
NORMALISED units (what training calls, not the prediction). It carries ``input_names``,
``output_names``, ``input_levels``, ``output_levels``, ``input_units``, ``output_units``,
``fill_threshold``, ``fill_value``, the training range (``input_min``, ``input_max``) and
``activation`` as attributes, and ``signature.json`` and ``provenance.json`` as extra
files (read them back with :func:`read_extra_files`). The ``export`` section of the config
(:class:`ExportConfig`) chooses the names (``short``, ``jedi`` or a complete mapping), the
levels, and so the units the module takes: every name carries its unit from one table
(:mod:`ufsemulator.export.names`; ``units`` may only confirm it), and the normalisation
is rewritten so the module takes those units.
Parameters are frozen (``requires_grad`` off): a C++ caller may run it in grad mode and
then under ``InferenceMode``. Load it in C++ with ``torch::jit::load`` or in Python with
``torch.jit.load``.
"""

from __future__ import annotations

import copy
import io
import math
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpcdist.state import DigestBook, output_mode, sha256_bytes, write_atomic
from ufsemulator.config import Config, ConfigError, ExportConfig
from ufsemulator.errors import CheckpointError
from ufsemulator.export import provenance, signature
from ufsemulator.export.names import (
    OCEAN_INPUTS,
    check_distinct,
    check_unit_keys,
    exported_names,
    exported_units,
    scheme_of,
)
from ufsemulator.model.emulator import EmulatorMLP, ModelConfig
from ufsemulator.variables import UNITS, conversion

# Prefixes a wrapped model adds to its state_dict keys (DDP, torch.compile).
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def export_model(
    model: EmulatorMLP,
    out: str | Path,
    options: ExportConfig | None = None,
    origin: Mapping[str, Any] | None = None,
    book: DigestBook | None = None,
) -> Path:
    """Script a copy of ``model`` (eval mode, on the CPU, parameters frozen, names, levels
    and units as ``options`` say) and save it atomically at ``out``, with its signature
    and ``origin`` (a :func:`provenance.build` record; a bare one if None) as extra files,
    and a model card beside it (``out`` with suffix ``.md``). Neither is writable by group
    or others, whatever the umask; with ``book``, their digests are recorded there."""
    out = Path(out)
    model = prepare_export(model, options or ExportConfig())
    record = dict(origin) if origin is not None else provenance.build()
    extra = {
        "format_version": str(provenance.FORMAT_VERSION),
        "signature.json": provenance.to_json(signature.of(model)),
        "provenance.json": provenance.to_json(record),
    }
    with warnings.catch_warnings():
        # torch >= 2.10 marks TorchScript deprecated; libtorch's C++ loader still needs it.
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = torch.jit.script(model)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(scripted, buffer, _extra_files=extra)
    card = signature.model_card(out.name, signature.of(model), record)
    for path, data in ((out, buffer.getvalue()), (out.with_suffix(".md"), card.encode())):
        write_atomic(path, data, output_mode())
        if book is not None:
            book.settle(Path(os.path.abspath(path)), sha256_bytes(data))
    return out


EXTRA_FILES = ("format_version", "signature.json", "provenance.json")


def read_extra_files(path: str | Path) -> dict[str, str]:
    """The extra files of an export (empty strings for those an older export lacks)."""
    extra = dict.fromkeys(EXTRA_FILES, "")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.load(str(path), _extra_files=extra)
    return {k: v.decode() if isinstance(v, bytes) else str(v) for k, v in extra.items()}


def check_export(model_config: ModelConfig, options: ExportConfig) -> None:
    """Raise the ConfigError an export of a model of ``model_config`` would raise: run
    before the first training step, so a bad name, unit or level costs no training."""
    prepare_export(EmulatorMLP(model_config), options)


def prepare_export(model: EmulatorMLP, options: ExportConfig) -> EmulatorMLP:
    """A frozen CPU copy of ``model`` with the names, levels and units of ``options``."""
    model = copy.deepcopy(model).cpu().eval()
    for param in model.parameters():
        param.requires_grad_(False)
    config = model.config
    ins, outs = config.input_names, config.output_names
    try:
        check_unit_keys(options.units, (*ins, *outs))
        model.input_names = exported_names(ins, options.names, outs)
        model.output_names = exported_names(outs, options.names, ins)
        check_distinct(model.input_names, model.output_names)
        scheme = scheme_of(options.names)
        input_units = exported_units(ins, model.input_names, options.units, scheme)
        output_units = exported_units(outs, model.output_names, options.units, scheme)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    _set_land(model, ins, options.land_value)
    if not options.range_margin >= 0.0:
        raise ConfigError(f"export.range_margin must be >= 0, got {options.range_margin}")
    model.fill_value = math.nan if options.fill_value is None else float(options.fill_value)
    model.range_margin = float(options.range_margin)
    model.fill_out_of_range = options.out_of_range == "fill"
    model.max_out_of_range = float(options.max_out_of_range)
    model.clamp_output = bool(options.clamp)
    chosen_levels = (
        ("input_levels", options.input_levels, config.n_in),
        ("output_levels", options.output_levels, config.n_out),
    )
    for attr, levels, count in chosen_levels:
        if levels is not None:
            if len(levels) != count:
                raise ConfigError(
                    f"export.{attr} must have {count} entries (one per "
                    f"{attr.split('_')[0]}), got {list(levels)}"
                )
            setattr(model, attr, [int(level) for level in levels])
    _convert_units(model, config.input_names, input_units, config.output_names, output_units)
    model.input_units, model.output_units = input_units, output_units
    return model


def _set_land(model: EmulatorMLP, inputs: tuple[str, ...], value: float | None) -> None:
    """Land stored as a number: a row whose ocean inputs all hold ``value`` is missing."""
    if value is None:
        return
    columns = [k for k, name in enumerate(inputs) if name in OCEAN_INPUTS]
    if not math.isfinite(value) or not columns:
        raise ConfigError(
            f"export.land_value must be a finite number and the model must have an ocean "
            f"input ({', '.join(OCEAN_INPUTS)}) to find land by; got {value} with inputs "
            f"{', '.join(inputs)}"
        )
    model.land_value = float(value)
    model.land_columns = columns


def _convert_units(
    model: EmulatorMLP,
    input_names: tuple[str, ...],
    input_units: list[str],
    output_names: tuple[str, ...],
    output_units: list[str],
) -> None:
    """Fold unit changes into the normalisation: exact for affine ones (degC <-> K)."""

    def factors(names: tuple[str, ...], units: list[str], to_native: bool) -> np.ndarray:
        out = np.tile([1.0, 0.0], (len(names), 1))
        for k, (name, unit) in enumerate(zip(names, units, strict=True)):
            native = UNITS.get(name, "")
            if unit == native:
                continue
            pair = conversion(unit, native) if to_native else conversion(native, unit)
            if pair is None:
                raise ConfigError(
                    f"export.units: cannot convert '{name}' between {native or 'no unit'} "
                    f"and {unit!r}"
                )
            out[k] = pair
        return out

    # The module gets x in the new units; the network wants x_n = a x + b, normalised
    # (x_n - m) / s = (x - (m - b) / a) / (s / a).
    x_f = factors(input_names, input_units, to_native=True)
    mean = model.input_mean.double().numpy()
    std = model.input_std.double().numpy()
    new_in = ((mean - x_f[:, 1]) / x_f[:, 0], std / np.abs(x_f[:, 0]))
    # Ranges and bounds take the new units as a value does (no conversion here flips sign).
    low = (model.input_min.double().numpy() - x_f[:, 1]) / x_f[:, 0]
    high = (model.input_max.double().numpy() - x_f[:, 1]) / x_f[:, 0]
    # It answers y = a y_n + b for y_n = z s + m: mean a m + b, std a s.
    y_f = factors(output_names, output_units, to_native=False)
    mean = model.output_mean.double().numpy()
    std = model.output_std.double().numpy()
    new_out = (y_f[:, 0] * mean + y_f[:, 1], y_f[:, 0] * std)
    model.output_lower = [
        float(a * v + b) for (a, b), v in zip(y_f, model.output_lower, strict=True)
    ]
    model.output_upper = [
        float(a * v + b) for (a, b), v in zip(y_f, model.output_upper, strict=True)
    ]
    with torch.no_grad():
        for name, values in (
            ("input_mean", new_in[0]),
            ("input_std", new_in[1]),
            ("input_min", low),
            ("input_max", high),
            ("output_mean", new_out[0]),
            ("output_std", new_out[1]),
        ):
            buffer = getattr(model, name)
            buffer.copy_(torch.as_tensor(values, dtype=buffer.dtype))


def load_checkpoint_model(checkpoint: str | Path) -> EmulatorMLP:
    """The model of a training checkpoint (``"model"`` state_dict + ``"model_config"``)."""
    return _model_of(_read_checkpoint(checkpoint), Path(checkpoint))


def checkpoint_export_config(checkpoint: str | Path, data: bytes | None = None) -> ExportConfig:
    """The ``export`` section of the config a checkpoint was trained with (defaults if none);
    with ``data``, of those bytes (the checkpoint's, as checked) instead of the file's."""
    path = Path(checkpoint)
    return _export_config_of(_read_checkpoint(path, data), path)


def _export_config_of(state: Mapping[str, Any], path: Path) -> ExportConfig:
    config = state.get("config")
    section = config.get("export") if isinstance(config, Mapping) else None
    if section is None:
        return ExportConfig()
    try:
        return Config.from_dict({"export": section}).export
    except ConfigError as exc:
        raise CheckpointError(f"bad 'export' section in the config of '{path}': {exc}") from exc


def _read_checkpoint(checkpoint: str | Path, data: bytes | None = None) -> Mapping[str, Any]:
    path = Path(checkpoint)
    if data is None and not path.is_file():
        raise CheckpointError(f"checkpoint '{path}' does not exist or is not a file")
    try:
        source = path if data is None else io.BytesIO(data)
        state = torch.load(source, map_location="cpu", weights_only=True)
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
    return state


def _model_of(state: Mapping[str, Any], path: Path) -> EmulatorMLP:
    if not isinstance(state["model_config"], Mapping):
        raise CheckpointError(f"'model_config' in checkpoint '{path}' is not a dict")
    try:
        config = ModelConfig.from_dict(state["model_config"])
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"bad 'model_config' in checkpoint '{path}': {exc}") from exc
    model = EmulatorMLP(config)
    try:
        weights = dict(_unwrap(state["model"]))
        # A checkpoint from before the training range was kept: the range stays unknown.
        for key in ("input_min", "input_max"):
            weights.setdefault(key, getattr(model, key))
        model.load_state_dict(weights)
    except (RuntimeError, TypeError, AttributeError, ValueError) as exc:
        raise CheckpointError(
            f"'model' weights in checkpoint '{path}' do not fit its model_config: {exc}"
        ) from exc
    return model.eval()


def export_checkpoint(
    checkpoint: str | Path,
    out: str | Path,
    options: ExportConfig | None = None,
    origin: Mapping[str, Any] | None = None,
    data: bytes | None = None,
    book: DigestBook | None = None,
) -> Path:
    """Export the model of a training checkpoint as TorchScript at ``out``; ``options``
    default to the ``export`` section of the config the checkpoint was trained with,
    ``origin`` to a provenance record with that config, the checkpoint's path, and the
    data and metrics of its run (:func:`provenance.checkpoint_origin`). With ``data``, the
    checkpoint is those bytes (as checked), not the file read again; with ``book``, the
    digests of what is written are recorded there."""
    path = Path(checkpoint)
    state = _read_checkpoint(path, data)
    chosen = options if options is not None else _export_config_of(state, path)
    if origin is None:
        config = state.get("config")
        origin = provenance.checkpoint_origin(
            path, config if isinstance(config, Mapping) else None, book
        )
    return export_model(_model_of(state, path), out, chosen, origin, book)


def _unwrap(state_dict: Any) -> Any:
    if not isinstance(state_dict, Mapping):
        return state_dict
    for prefix in _WRAPPER_PREFIXES:
        if state_dict and all(str(k).startswith(prefix) for k in state_dict):
            state_dict = {str(k)[len(prefix) :]: v for k, v in state_dict.items()}
    return state_dict
