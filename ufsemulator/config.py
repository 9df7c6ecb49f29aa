"""Training configuration: YAML loaded into frozen dataclasses.

The dataclass defaults below are the one source of the defaults: ``Config()`` is exactly
what a job gets with no config file. They are the source, not the YAML, because they cannot
be dropped: a section written before a key existed (an older checkpoint's config, an export
section) is completed from them, and ``ExportConfig()`` is built directly. A user file is
merged over ``Config().to_dict()``; every key is checked against the dataclass fields, so a
typo is an error that names the key and the allowed ones instead of a silently ignored
setting. The packaged ``configs/default.yaml`` is the annotated copy a user starts from
(why each default is what it is, measured); it is not read to make a config, and a test
(tests/ufsemulator/test_config.py) keeps its keys and values equal to ``Config()``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.resources
import math
import signal
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from ufsemulator.data.sources import parse_time
from ufsemulator.variables import INPUT_NAMES, check_inputs


class ConfigError(ValueError):
    """A configuration file or value is invalid."""


@dataclass(frozen=True)
class SyntheticConfig:
    """Grid of the synthetic CICE-like file generated when no data path is given."""

    ni: int = 384
    nj: int = 320
    seed: int = 0


@dataclass(frozen=True)
class DataConfig:
    # A file, a glob or a list of them, in time order; None: the synthetic file.
    path: str | tuple[str, ...] | None = None
    # The atmosphere file paired with each file of `path` (the CF-named pair).
    atmosphere: str | tuple[str, ...] | None = None
    time: int | str = "all"  # all | INDEX | START:STOP over the records of all files
    inputs: tuple[str, ...] = INPUT_NAMES
    mask: Literal["sea_ice", "ocean", "both"] = "sea_ice"
    thin: int = 1
    target: Literal["aice", "sst", "tair"] = "aice"
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    # Start reading the given files before torch is imported (training.earlyread). Off:
    # measured on 2 cores, the reading child slowed torch's import more than it saved.
    read_early: bool = False

    def __post_init__(self) -> None:
        try:
            parse_time(self.time)
            object.__setattr__(self, "inputs", check_inputs(self.inputs))
        except ValueError as exc:
            raise ConfigError(f"'data': {exc}") from None
        if self.atmosphere is not None and self.path is None:
            raise ConfigError("'data.atmosphere' pairs with 'data.path', which is not set")


@dataclass(frozen=True)
class ExportConfig:
    """What the export tells its caller (a DA system looks names up, never units)."""

    # short | jedi | soca | {our name: exported name}: soca takes a SOCA background's names
    # and units (air_temperature in CICE's degC where jedi's is K; ufsemulator.export.names)
    names: str | dict[str, str] = "short"
    # A name carries its unit (ufsemulator.export.names): None takes those units; native,
    # jedi or {name: unit} are checked against them, so a name never comes in a foreign unit.
    units: str | dict[str, str] | None = None  # native | jedi | {name: unit}
    input_levels: tuple[int, ...] | None = None  # None: the model's (0, the surface)
    output_levels: tuple[int, ...] | None = None
    # predict's answer for a row with a NaN, infinite or fill input (never a plausible 0);
    # None: NaN (not written as NaN here, so that two configs compare equal).
    fill_value: float | None = None
    # Land stored as a number (SOCA: 0.0) or a finite sentinel: a row whose ocean inputs
    # (sst, sss, uocn, vocn) all hold it is missing, like a NaN row. None: no such value.
    land_value: float | None = None
    # An input further than this fraction of its training range outside that range is
    # out of range: flagged by row_flags(); with out_of_range: fill (the default), predict
    # answers fill_value there too, never an extrapolated number; flag: predict answers.
    range_margin: float = 0.1
    out_of_range: Literal["flag", "fill"] = "fill"
    # jac_physical, tlm and adjoint refuse (raise, with the counts per input) when more
    # than this share of the rows with data is out of range: a background in the wrong
    # units would otherwise get a zero Jacobian everywhere, silently. 1.0: never refuse.
    max_out_of_range: float = 0.01
    clamp: bool = False  # clamp predict to the output's physical bounds (aice: [0, 1])
    aoti: bool = False  # also write model.pt2 (AOTInductor) beside model.pt after training

    def __post_init__(self) -> None:
        for key, words in (("names", ("short", "jedi", "soca")), ("units", ("native", "jedi"))):
            value = getattr(self, key)
            if isinstance(value, str) and value not in words:
                raise ConfigError(
                    f"'export.{key}' must be {' or '.join(words)} or a mapping, got {value!r}"
                )
        share = self.max_out_of_range
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share <= 1:
            raise ConfigError(
                f"'export.max_out_of_range' must be a share from 0 to 1 (1: never refuse), "
                f"got {share!r}"
            )


@dataclass(frozen=True)
class ModelSection:
    hidden_sizes: tuple[int, ...] = (64, 64, 64)
    activation: Literal["relu", "tanh", "gelu", "silu"] = "gelu"


@dataclass(frozen=True)
class TrainingConfig:
    epochs: int = 150
    batch_size: int = 1000  # per rank
    lr: float = 2e-4
    weight_decay: float = 1e-4
    loss: Literal["mse", "mae", "huber"] = "mse"
    huber_delta: float = 1.0
    grad_accum_steps: int = 1
    # lr x ranks: batch_size is per rank, so N ranks take 1/N of the steps of an epoch.
    scale_lr_with_world_size: bool = True
    # With the rate scaled: it rises linearly from lr to lr x ranks over this many epochs
    # of optimiser steps (Goyal et al. 2017; training.warmup); 0: scaled from the first step.
    lr_warmup_epochs: float = 0.0
    val_fraction: float = 0.2
    seed: int = 42
    early_stopping_patience: int = 10  # epochs without improvement; 0 disables
    strategy: Literal["ddp", "fsdp"] = "ddp"
    checkpoint_every: int = 1  # epochs
    # Speed only, results unchanged: DDP's gradient bucket size (None: torch's 25 MiB, one
    # bucket for this model; smaller ones start all-reducing during the backward pass),
    # torch.compile of the model (on GPUs with Triton, ddp only; elsewhere ignored) and
    # CUDA graphs of the whole training step (GPUs, ddp, no compile; ignored on the CPU);
    # the gradient all-reduce (local: for DDP with every rank on one host, shared memory
    # on the CPU and symmetric-memory one-shot on GPUs where available, else the
    # backend's; auto: as local, but on GPUs only for runs long enough to pay for the
    # symmetric memory's set-up (gradreduce.SYMMETRIC_MIN_STEPS), and for CPU ranks on
    # several hosts the exchange training.crossnode picks from N and the gradients' size;
    # direct: CPU ranks send their gradients to every rank over TCP, one round
    # (meshreduce); halving: CPU ranks over TCP by recursive halving and doubling, about 2
    # copies a rank at any N (halvingreduce); backend: always the backend's).
    ddp_bucket_cap_mb: float | None = None
    compile: bool = False
    cuda_graph: bool = True
    grad_allreduce: Literal["auto", "local", "direct", "halving", "backend"] = "auto"
    # Stop (completed) at the first epoch whose validation loss is at or below this
    # (normalised units); None: train the epochs (or until early stopping).
    target_val_loss: float | None = None
    # For tests only: every checkpoint write waits this long first, as a slow disk would
    # (the job then checkpoints early where its warning lead is too short).
    test_checkpoint_delay_s: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.test_checkpoint_delay_s < math.inf:
            raise ConfigError(
                "'training.test_checkpoint_delay_s' must be a number >= 0, got "
                f"{self.test_checkpoint_delay_s}"
            )
        if not 0.0 < self.val_fraction < 1.0:
            raise ConfigError(f"'training.val_fraction' must be in (0, 1), got {self.val_fraction}")
        if not 0.0 <= self.lr_warmup_epochs < math.inf:
            raise ConfigError(
                f"'training.lr_warmup_epochs' must be a number >= 0, got {self.lr_warmup_epochs}"
            )


@dataclass(frozen=True)
class OutputConfig:
    run_dir: str | None = None


@dataclass(frozen=True)
class PreemptionConfig:
    # USR2 by default: NCCL may install its own handler for USR1.
    signal: str = "SIGUSR2"
    # Ranks agree on a stop request every this many optimiser steps (one tiny all_reduce,
    # on the CPU; 50 steps are well under a second, the warning comes 90 s ahead).
    check_every_steps: int = 50

    def __post_init__(self) -> None:
        name = self.signal if self.signal.startswith("SIG") else f"SIG{self.signal}"
        if not isinstance(getattr(signal, name, None), signal.Signals):
            raise ConfigError(f"'preemption.signal' is not a signal name: {self.signal!r}")
        object.__setattr__(self, "signal", name)


@dataclass(frozen=True)
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelSection = field(default_factory=ModelSection)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    preemption: PreemptionConfig = field(default_factory=PreemptionConfig)
    export: ExportConfig = field(default_factory=ExportConfig)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (lists, no tuples) that YAML and ``torch.load(weights_only)`` accept."""
        return _plain(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Config:
        return _build(cls, data, "")

    def with_epochs(self, epochs: int) -> Config:
        if epochs < 1:
            raise ConfigError(f"epochs must be >= 1, got {epochs}")
        return dataclasses.replace(self, training=dataclasses.replace(self.training, epochs=epochs))


_POSITIVE = {
    "training.epochs",
    "training.batch_size",
    "training.grad_accum_steps",
    "training.checkpoint_every",
    "data.thin",
    "data.synthetic.ni",
    "data.synthetic.nj",
    "preemption.check_every_steps",
    "model.hidden_sizes",
}


# Integers that may be negative (a record counted from the end).
_SIGNED = {"data.time", "export.fill_value", "export.land_value"}
_KIND_WORDS = {str: "a string", int: "an integer", tuple: "a list", dict: "a mapping"}


def default_config_path() -> Path:
    """The annotated copy of the defaults (``Config()``), shipped for users to start from."""
    return Path(str(importlib.resources.files("ufsemulator") / "configs" / "default.yaml"))


def load_config(path: str | Path | None = None) -> Config:
    """The default config (``Config()``), with the YAML file at ``path`` merged over it."""
    merged = Config().to_dict()
    if path is not None:
        merged = _merge(merged, _read_yaml(Path(path)), "")
    return Config.from_dict(merged)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file '{path}': {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file '{path}' is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file '{path}' must hold a mapping, got {type(data).__name__}")
    return data


def _merge(base: dict[str, Any], over: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value, f"{prefix}{key}.")
        else:
            out[key] = value
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


_T = typing.TypeVar("_T")


@functools.cache
def _schema(cls: type) -> tuple[dict[str, Any], list[str]]:
    """A config class's field types and names, worked out once (a sweep of thousands of
    points builds a config for each)."""
    return typing.get_type_hints(cls), [f.name for f in dataclasses.fields(cls)]


def _build(cls: type[_T], data: Mapping[str, Any], prefix: str) -> _T:
    where = prefix.rstrip(".") or "config"
    if not isinstance(data, Mapping):
        raise ConfigError(f"'{where}' must be a mapping, got {data!r}")
    hints, names = _schema(cls)  # type: ignore[arg-type]
    for key in data:
        if key not in names:
            raise ConfigError(
                f"unknown key '{prefix}{key}' in config; allowed in '{where}': {', '.join(names)}"
            )
    kwargs = {key: _convert(hints[key], value, f"{prefix}{key}") for key, value in data.items()}
    return cls(**kwargs)


def _convert(hint: Any, value: Any, name: str) -> Any:
    """``value`` checked against the field type ``hint`` (and made a tuple where it is one)."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value if value is not None else {}, f"{name}.")  # type: ignore[arg-type]
    if origin in (Union, types.UnionType):
        return _convert_union(args, value, name)
    if origin is dict:
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise ConfigError(f"'{name}' must be a mapping of names to names, got {value!r}")
        return dict(value)
    if origin is Literal:
        if value not in args:
            allowed = ", ".join(repr(a) for a in args)
            raise ConfigError(f"'{name}' must be one of {allowed}, got {value!r}")
        return value
    if origin is tuple:
        return _convert_tuple(args[0], value, name)
    return _convert_scalar(hint, value, name)


def _convert_union(args: tuple[Any, ...], value: Any, name: str) -> Any:
    if value is None and type(None) in args:
        return None
    inner = [a for a in args if a is not type(None)]
    if len(inner) == 1:
        return _convert(inner[0], value, name)
    # Several kinds (a file or a list of files): the first that takes the value.
    for kind in inner:
        with contextlib.suppress(ConfigError):
            return _convert(kind, value, name)
    kinds = " or ".join(_KIND_WORDS.get(typing.get_origin(k) or k, str(k)) for k in inner)
    raise ConfigError(f"'{name}' must be {kinds}, got {value!r}")


def _convert_tuple(item: Any, value: Any, name: str) -> tuple[Any, ...]:
    if not isinstance(value, (list, tuple)) or not value:
        raise ConfigError(f"'{name}' must be a non-empty list, got {value!r}")
    items = tuple(_convert(item, v, f"{name}[{i}]") for i, v in enumerate(value))
    if name in _POSITIVE and any(v < 1 for v in items):
        raise ConfigError(f"'{name}' entries must be >= 1, got {list(items)!r}")
    return items


def _convert_scalar(hint: Any, value: Any, name: str) -> Any:
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"'{name}' must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"'{name}' must be an integer, got {value!r}")
        if (name in _POSITIVE and value < 1) or (value < 0 and name not in _SIGNED):
            bound = 1 if name in _POSITIVE else 0
            raise ConfigError(f"'{name}' must be >= {bound}, got {value}")
        return value
    if hint is float:
        return _to_float(value, name)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"'{name}' must be a string, got {value!r}")
        return value
    raise TypeError(f"unsupported config field type {hint!r} for '{name}'")  # programming error


def _to_float(value: Any, name: str) -> float:
    # PyYAML follows YAML 1.1, where `1e-4` (no dot) is a string, not a float: accept it.
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(f"'{name}' must be a number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"'{name}' must be a number, got {value!r}")
    if value < 0 and name not in _SIGNED:
        raise ConfigError(f"'{name}' must be >= 0, got {value}")
    return float(value)
