"""The emulator: a per-point MLP with its normalisation and an analytic Jacobian.

``forward`` works in normalised space (what training optimises); ``predict`` and
``jac_physical`` work in physical units (what a data-assimilation system calls). The
Jacobian is propagated layer by layer rather than taken with autograd, so it also works
where the caller has disabled gradients (``torch::NoGradGuard`` or inference mode in C++)
and costs one pass instead of one per output.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from ufsemulator.data import INPUT_NAMES
from ufsemulator.normalization import Stats

ACTIVATIONS: tuple[str, ...] = ("relu", "tanh", "gelu", "silu")


@dataclass(frozen=True)
class ModelConfig:
    n_in: int = len(INPUT_NAMES)
    n_out: int = 1
    hidden: tuple[int, ...] = (64, 64, 64)
    activation: str = "gelu"
    input_names: tuple[str, ...] = INPUT_NAMES
    output_names: tuple[str, ...] = ("aice",)
    # Model level of each variable; 0 is the surface (all of the default ones).
    input_levels: tuple[int, ...] = field(default=(0,) * len(INPUT_NAMES))
    output_levels: tuple[int, ...] = (0,)

    def __post_init__(self) -> None:
        for name in ("hidden", "input_names", "output_names", "input_levels", "output_levels"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.n_in < 1 or self.n_out < 1:
            raise ValueError(f"n_in and n_out must be >= 1, got {self.n_in}, {self.n_out}")
        if not self.hidden or any(h < 1 for h in self.hidden):
            raise ValueError(f"hidden sizes must be a non-empty list of ints >= 1, got "
                             f"{list(self.hidden)}")  # fmt: skip
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {', '.join(ACTIVATIONS)}, got {self.activation!r}"
            )
        for name, expected in (
            ("input_names", self.n_in), ("input_levels", self.n_in),
            ("output_names", self.n_out), ("output_levels", self.n_out),
        ):  # fmt: skip
            got = len(getattr(self, name))
            if got != expected:
                raise ValueError(f"{name} must have {expected} entries, got {got}")

    def to_dict(self) -> dict[str, Any]:
        """Plain ints, strings and lists: safe for YAML, JSON and ``weights_only`` loads."""
        return {key: list(value) if isinstance(value, tuple) else value
                for key, value in asdict(self).items()}  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelConfig:
        allowed = [f for f in cls.__dataclass_fields__]
        unknown = [key for key in data if key not in allowed]
        if unknown:
            raise ValueError(
                f"unknown model config key {unknown[0]!r}; allowed: {', '.join(allowed)}"
            )
        kwargs: dict[str, Any] = {
            key: tuple(v) if isinstance(v, list) else v for key, v in data.items()
        }
        return cls(**kwargs)


class EmulatorMLP(nn.Module):
    """``n_in -> hidden... -> n_out`` with normalisation buffers; scriptable."""

    if TYPE_CHECKING:
        # For mypy only: TorchScript cannot read the string annotations of a class body
        # under `from __future__ import annotations`; it infers these from the values.
        activation: str
        n_in: int
        n_out: int
        input_names: list[str]
        output_names: list[str]
        input_levels: list[int]
        output_levels: list[int]
        input_mean: torch.Tensor
        input_std: torch.Tensor
        output_mean: torch.Tensor
        output_std: torch.Tensor

    def __init__(self, config: ModelConfig | None = None) -> None:
        super().__init__()
        config = config or ModelConfig()
        self.config = config
        sizes = [config.n_in, *config.hidden, config.n_out]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(sizes))
        self.activation = config.activation
        self.n_in = config.n_in
        self.n_out = config.n_out
        self.input_names = list(config.input_names)
        self.output_names = list(config.output_names)
        self.input_levels = list(config.input_levels)
        self.output_levels = list(config.output_levels)
        self.register_buffer("input_mean", torch.zeros(config.n_in))
        self.register_buffer("input_std", torch.ones(config.n_in))
        self.register_buffer("output_mean", torch.zeros(config.n_out))
        self.register_buffer("output_std", torch.ones(config.n_out))

    @torch.jit.ignore
    def set_normalization(self, stats: Stats) -> None:
        pairs = (
            ("input_mean", stats.input_mean), ("input_std", stats.input_std),
            ("output_mean", stats.output_mean), ("output_std", stats.output_std),
        )  # fmt: skip
        for name, values in pairs:
            buffer = getattr(self, name)
            if tuple(values.shape) != tuple(buffer.shape):
                raise ValueError(
                    f"{name} has shape {tuple(values.shape)}, model expects {tuple(buffer.shape)}"
                )
            if name.endswith("std") and (values <= 0).any():
                raise ValueError(f"{name} must be positive, got {values.tolist()}")
            buffer.copy_(torch.as_tensor(values, dtype=buffer.dtype))

    def _act(self, z: torch.Tensor) -> torch.Tensor:
        if self.activation == "relu":
            return F.relu(z)
        if self.activation == "tanh":
            return torch.tanh(z)
        if self.activation == "silu":
            return F.silu(z)
        return F.gelu(z)

    def _act_grad(self, z: torch.Tensor) -> torch.Tensor:
        if self.activation == "relu":
            return (z > 0).to(z.dtype)
        if self.activation == "tanh":
            t = torch.tanh(z)
            return 1.0 - t * t
        if self.activation == "silu":
            s = torch.sigmoid(z)
            return s * (1.0 + z * (1.0 - s))
        # Exact (erf) GELU: Phi(z) + z * phi(z).
        cdf = 0.5 * (1.0 + torch.erf(z * (1.0 / math.sqrt(2.0))))
        pdf = torch.exp(-0.5 * z * z) * (1.0 / math.sqrt(2.0 * math.pi))
        return cdf + z * pdf

    def forward(self, x_norm: torch.Tensor) -> torch.Tensor:
        """Normalised inputs ``[N, n_in]`` -> normalised outputs ``[N, n_out]``."""
        h = x_norm
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i < last:
                h = self._act(h)
        return h

    @torch.jit.export
    def normalize_inputs(self, x_phys: torch.Tensor) -> torch.Tensor:
        return (x_phys - self.input_mean) / self.input_std

    @torch.jit.export
    def denormalize_outputs(self, y_norm: torch.Tensor) -> torch.Tensor:
        return y_norm * self.output_std + self.output_mean

    @torch.jit.export
    def predict(self, x_phys: torch.Tensor) -> torch.Tensor:
        """Physical inputs ``[N, n_in]`` -> physical outputs ``[N, n_out]``."""
        return self.denormalize_outputs(self.forward(self.normalize_inputs(x_phys)))

    @torch.jit.export
    def jac_physical(self, inputs: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """d(physical output)/d(physical input), ``[N, n_out, n_in]``.

        Rows where ``mask`` is False/0, or an input is not finite, are zero; any
        remaining non-finite entry is zero too.
        """
        x = self.normalize_inputs(inputs)
        weights: list[torch.Tensor] = []
        pre: list[torch.Tensor] = []
        h = x
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            weights.append(layer.weight)  # type: ignore[arg-type]
            if i < last:
                h = layer(h)
                pre.append(h)
                h = self._act(h)
        # Back from the output: J = W_L diag(act'(z_L-1)) W_L-1 ... diag(act'(z_1)) W_1,
        # carried as [N, n_out, width]: cheap when n_out is small, as for aice.
        n = inputs.shape[0]
        w_out = weights[last]
        jac = w_out.unsqueeze(0).expand(n, w_out.shape[0], w_out.shape[1])
        for i in range(last - 1, -1, -1):
            jac = torch.matmul(jac * self._act_grad(pre[i]).unsqueeze(1), weights[i])
        jac = jac * (self.output_std.unsqueeze(1) / self.input_std.unsqueeze(0)).unsqueeze(0)

        valid = torch.isfinite(inputs).all(dim=1)
        if mask is not None:
            valid = valid & (mask.reshape(-1) != 0)
        zero = torch.zeros_like(jac)
        jac = torch.where(valid.reshape(-1, 1, 1), jac, zero)
        return torch.where(torch.isfinite(jac), jac, zero)
