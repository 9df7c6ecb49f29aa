"""The emulator: a per-point MLP with its normalisation and an analytic Jacobian.

``forward`` works in NORMALISED space (what training optimises, NOT the model's prediction:
for physical inputs it is off by the normalisation); ``predict``,
``jac_physical``, ``tlm`` and ``adjoint`` work in physical units (what a data-assimilation
system calls), accept float32 and float64 and answer in the inputs' dtype. The
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

from ufsemulator.model.normalization import Stats
from ufsemulator.variables import INPUT_NAMES, OUTPUT_BOUNDS, UNITS

ACTIVATIONS: tuple[str, ...] = ("relu", "tanh", "gelu", "silu")
FILL_THRESHOLD = 1.0e20
# row_flags codes: what a caller should make of each row's prediction.
ROW_OK, ROW_OUT_OF_RANGE, ROW_MISSING = 0, 1, 2
# Rows are computed in blocks of this many (the last padded): a row's bits are then the
# same in a batch of any size (a matrix product's kernel, and so its order of additions,
# depends on the number of rows) and on any number of threads (a block is small enough for
# one). Measured in bench/batch_invariance.py.
BLOCK_ROWS = 256


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
            raise ValueError(
                f"hidden sizes must be a non-empty list of ints >= 1, got {list(self.hidden)}"
            )
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {', '.join(ACTIVATIONS)}, got {self.activation!r}"
            )
        for name, expected in (
            ("input_names", self.n_in),
            ("input_levels", self.n_in),
            ("output_names", self.n_out),
            ("output_levels", self.n_out),
        ):
            got = len(getattr(self, name))
            if got != expected:
                raise ValueError(f"{name} must have {expected} entries, got {got}")

    def to_dict(self) -> dict[str, Any]:
        """Plain ints, strings and lists: safe for YAML, JSON and ``weights_only`` loads."""
        return {
            key: list(value) if isinstance(value, tuple) else value
            for key, value in asdict(self).items()
        }

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
        input_units: list[str]
        output_units: list[str]
        fill_threshold: float
        fill_value: float
        range_margin: float
        fill_out_of_range: bool
        clamp_output: bool
        max_out_of_range: float
        land_value: float
        land_columns: list[int]
        block_rows: int
        output_lower: list[float]
        output_upper: list[float]
        input_min: torch.Tensor
        input_max: torch.Tensor
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
        # Units the module takes and gives ("" where a name has none in the table).
        self.input_units = [UNITS.get(name, "") for name in config.input_names]
        self.output_units = [UNITS.get(name, "") for name in config.output_names]
        # |x| at or above this is a fill value (CICE writes 1e30 over land), not data.
        self.fill_threshold = FILL_THRESHOLD
        # What predict answers for a row it cannot predict (set by the export).
        self.fill_value = math.nan
        self.range_margin = 0.1
        self.fill_out_of_range = False
        self.clamp_output = False
        # The largest share of rows with data (mask non-zero) that may lie out of range
        # before jac_physical, tlm and adjoint refuse (an export sets it; 1.0: never).
        self.max_out_of_range = 1.0
        # Land stored as a number (SOCA writes 0.0 over land): a row whose land_columns
        # all hold land_value is missing. NaN (never equal): no land value.
        self.land_value = math.nan
        self.land_columns = list(range(config.n_in))
        self.block_rows = BLOCK_ROWS
        bounds = [OUTPUT_BOUNDS.get(name, (-math.inf, math.inf)) for name in config.output_names]
        self.output_lower = [float(lo) for lo, _ in bounds]
        self.output_upper = [float(hi) for _, hi in bounds]
        # The training range of each input (unknown until set: everything is in range).
        self.register_buffer("input_min", torch.full((config.n_in,), -math.inf))
        self.register_buffer("input_max", torch.full((config.n_in,), math.inf))
        self.register_buffer("input_mean", torch.zeros(config.n_in))
        self.register_buffer("input_std", torch.ones(config.n_in))
        self.register_buffer("output_mean", torch.zeros(config.n_out))
        self.register_buffer("output_std", torch.ones(config.n_out))

    @torch.jit.ignore
    def set_normalization(self, stats: Stats) -> None:
        pairs = (
            ("input_mean", stats.input_mean),
            ("input_std", stats.input_std),
            ("output_mean", stats.output_mean),
            ("output_std", stats.output_std),
        )
        for name, values in pairs:
            buffer = getattr(self, name)
            if tuple(values.shape) != tuple(buffer.shape):
                raise ValueError(
                    f"{name} has shape {tuple(values.shape)}, model expects {tuple(buffer.shape)}"
                )
            if name.endswith("std") and (values <= 0).any():
                raise ValueError(f"{name} must be positive, got {values.tolist()}")
            buffer.copy_(torch.as_tensor(values, dtype=buffer.dtype))

    @torch.jit.ignore
    def set_input_range(self, low: Any, high: Any) -> None:
        """The smallest and largest training value of each input (in the model's units)."""
        for buffer, values in ((self.input_min, low), (self.input_max, high)):
            tensor = torch.as_tensor(values, dtype=buffer.dtype).reshape(-1)
            if tensor.shape != buffer.shape:
                raise ValueError(
                    f"input range has {tensor.numel()} values, model has {buffer.numel()} inputs"
                )
            buffer.copy_(tensor)

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
        """NORMALISED inputs ``[N, n_in]`` -> NORMALISED outputs ``[N, n_out]``.

        NOT the model's prediction: what training optimises. A caller with physical fields
        wants ``predict`` (or ``jac_physical``); ``forward`` on physical values is off by the
        normalisation. Kept as ``forward`` because the training loop calls the module."""
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
    def row_flags(self, inputs: torch.Tensor) -> torch.Tensor:
        """``[N]`` int8 per row: 0 in range, 1 an input beyond its training range by more
        than ``range_margin`` of that range, 2 missing (a NaN, infinite or fill value)."""
        _, valid = self._prepare(inputs)
        return self._flags(inputs, valid)

    def _flags(self, inputs: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        outside = self._outside(inputs).any(dim=1)
        # Literals: TorchScript cannot read module constants (ROW_OK, ...) here.
        flags = torch.where(outside, 1, 0)
        return torch.where(valid, flags, 2).to(torch.int8)

    def _outside(self, inputs: torch.Tensor) -> torch.Tensor:
        """``[N, n_in]``: each value beyond its training range by more than the margin."""
        dtype = self.input_min.dtype
        if inputs.dtype == torch.float64:
            dtype = inputs.dtype
        low, high = self.input_min.to(dtype), self.input_max.to(dtype)
        width = high - low
        # An infinite bound (range unknown) gives inf - inf = NaN: no bound there.
        pad = torch.where(torch.isfinite(width), width * self.range_margin, torch.zeros_like(width))
        x = inputs.to(dtype)
        return (x < low - pad) | (x > high + pad)

    @torch.jit.export
    def check_background(
        self, inputs: torch.Tensor, mask: torch.Tensor | None = None
    ) -> dict[str, int]:
        """A cycle's pre-check: for each input name, how many rows with data hold it out of
        range; ``rows``, ``missing_rows`` (flag 2), ``rows_with_data`` (not missing, mask
        non-zero), ``out_of_range_rows`` (flag 1 among them) and ``allowed_out_of_range_rows``
        (what ``max_out_of_range`` lets jac_physical, tlm and adjoint accept)."""
        _, valid = self._prepare(inputs)
        used = self._used(valid, mask, inputs.shape[0])
        outside = self._outside(inputs) & used.unsqueeze(1)
        counts: dict[str, int] = {}
        for k, name in enumerate(self.input_names):
            counts[name] = int(outside[:, k].sum())
        counts["rows"] = int(inputs.shape[0])
        counts["missing_rows"] = int((~valid).sum())
        counts["rows_with_data"] = int(used.sum())
        counts["out_of_range_rows"] = int(outside.any(dim=1).sum())
        allowed = self.max_out_of_range * counts["rows_with_data"]
        counts["allowed_out_of_range_rows"] = math.floor(allowed)
        return counts

    def _used(self, valid: torch.Tensor, mask: torch.Tensor | None, n: int) -> torch.Tensor:
        """Rows a linearisation is asked for: data (not missing, not land), mask non-zero."""
        if mask is None:
            return valid
        if mask.numel() != n:
            raise ValueError(
                f"mask must hold one value per input row ({n} rows), got shape {mask.shape}"
            )
        m = mask.reshape(n)
        return valid & torch.isfinite(m) & (m != 0)

    def _refuse_out_of_range(
        self,
        inputs: torch.Tensor,
        flags: torch.Tensor,
        used: torch.Tensor,
        caller: str,
        traced: bool,
    ) -> None:
        """Refuse a linearisation when more than ``max_out_of_range`` of the rows with data
        are out of range: a background in the wrong units, or one the model never saw,
        would otherwise get a zero Jacobian everywhere and a cycle no balance at all."""
        if self.max_out_of_range >= 1.0:
            return
        out = ((flags == 1) & used).sum()
        limit = self.max_out_of_range * used.sum().to(torch.float64)
        if traced:
            # torch.export: no data-dependent branch; the package throws this message.
            torch._assert_async(
                out.to(torch.float64) <= limit,
                f"{caller} refused: more than {self.max_out_of_range} of the rows with data "
                "are outside the training range (row_flags 1; export.max_out_of_range); "
                "is the background in the units of input_units? predict gives the row flags",
            )
            return
        if float(out) <= float(limit):
            return
        outside = self._outside(inputs) & used.unsqueeze(1)
        parts: list[str] = []
        for k, name in enumerate(self.input_names):
            count = int(outside[:, k].sum())
            if count > 0:
                parts.append(f"{name} ({self.input_units[k]}) {count}")
        raise ValueError(
            f"{caller} refused: {int(out)} of {int(used.sum())} rows with data are outside "
            f"the training range, more than export.max_out_of_range {self.max_out_of_range} "
            f"allows; rows out of range per input: {', '.join(parts)}; is the background in "
            f"the units of input_units? check_background(inputs) gives the counts"
        )

    @torch.jit.export
    def predict(self, inputs: torch.Tensor) -> torch.Tensor:
        """Physical inputs ``[N, n_in]`` -> physical outputs ``[N, n_out]``, in the inputs'
        dtype (float32 or float64). A missing row (a NaN or fill value, |x| >= 1e20, or
        land: ``land_value`` in every ocean input) gives ``fill_value`` (NaN unless the
        export chose another), as does a row out of range when ``fill_out_of_range``; with
        ``clamp_output`` the answer is clamped to ``output_lower`` .. ``output_upper``."""
        return self._predict(inputs, True)

    def _predict(self, inputs: torch.Tensor, by_block: bool) -> torch.Tensor:
        x, valid = self._prepare(inputs)
        y = self._blocks(x, False, by_block)[0]
        y = y * self.output_std.to(x.dtype) + self.output_mean.to(x.dtype)
        if self.clamp_output:
            low, high = self._bounds(y)
            y = torch.minimum(torch.maximum(y, low), high)
        keep = valid
        if self.fill_out_of_range:
            keep = self._flags(inputs, valid) == 0
        return torch.where(keep.unsqueeze(1), y, torch.full_like(y, self.fill_value))

    def _bounds(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        low = torch.tensor(self.output_lower, dtype=y.dtype, device=y.device)
        high = torch.tensor(self.output_upper, dtype=y.dtype, device=y.device)
        return low, high

    @torch.jit.export
    def jac_physical(self, inputs: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """d(physical output)/d(physical input), ``[N, n_out, n_in]``, in the inputs' dtype:
        the derivative of what ``predict`` returns (0 for an output ``clamp_output`` clamps).

        Each row is multiplied by its ``mask`` value (``[N]`` or ``[N, 1]``, any dtype;
        fractions allowed, NaN counts as 0), as SABER's reference emulators do. A row that
        ``row_flags`` does not pass (missing, land, or out of range: beyond the training
        range by more than ``range_margin`` of it) is zero, whatever ``out_of_range`` says:
        a linearisation outside the training data is not one a DA system should apply.
        When more than ``max_out_of_range`` of the rows with data are out of range, it
        raises a ValueError with the counts per input instead (so do ``tlm``, ``adjoint``).
        """
        return self._linearised(inputs, mask, True, "jac_physical")[0]

    def _jacobian(
        self, inputs: torch.Tensor, mask: torch.Tensor | None, by_block: bool
    ) -> torch.Tensor:
        return self._linearised(inputs, mask, by_block, "jac_physical")[0]

    def _linearised(
        self, inputs: torch.Tensor, mask: torch.Tensor | None, by_block: bool, caller: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The Jacobian ``[N, n_out, n_in]`` and each row's weight ``[N]`` (0: not used)."""
        x, valid = self._prepare(inputs)
        dtype = x.dtype
        n = x.shape[0]
        flags = self._flags(inputs, valid)
        self._refuse_out_of_range(inputs, flags, self._used(valid, mask, n), caller, not by_block)
        y, jac = self._blocks(x, True, by_block)
        scale = self.output_std.to(dtype).unsqueeze(1) / self.input_std.to(dtype).unsqueeze(0)
        jac = jac * scale.unsqueeze(0)
        if self.clamp_output:
            y = y * self.output_std.to(dtype) + self.output_mean.to(dtype)
            low, high = self._bounds(y)
            jac = jac * ((y >= low) & (y <= high)).to(dtype).unsqueeze(2)
        row = (flags == 0).to(dtype)
        if mask is not None:
            m = mask.reshape(n).to(dtype)
            row = row * torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        jac = jac * row.reshape(n, 1, 1)
        return torch.where(torch.isfinite(jac), jac, torch.zeros_like(jac)), row

    @torch.jit.export
    def tlm(
        self, inputs: torch.Tensor, dx: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Tangent linear at ``inputs``: ``J dx``, ``[N, n_out]`` (same rules as jac; a row
        whose Jacobian is zeroed gives 0 whatever its ``dx``, NaN included)."""
        return self._tlm(inputs, dx, mask, True)

    def _tlm(
        self, inputs: torch.Tensor, dx: torch.Tensor, mask: torch.Tensor | None, by_block: bool
    ) -> torch.Tensor:
        if dx.shape != inputs.shape:
            raise ValueError(f"dx must have the shape of inputs {inputs.shape}, got {dx.shape}")
        jac, row = self._linearised(inputs, mask, by_block, "tlm")
        dx = torch.where(row.unsqueeze(1) != 0, dx.to(jac.dtype), torch.zeros_like(jac[:, 0]))
        # A sum over n_in in a fixed order, element by element: the same bits in any batch.
        products = jac * dx.unsqueeze(1)
        return _ordered_sum(products)

    @torch.jit.export
    def adjoint(
        self, inputs: torch.Tensor, dy: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Adjoint at ``inputs``: ``J^T dy``, ``[N, n_in]``, for ``dy`` ``[N, n_out]`` (a
        row whose Jacobian is zeroed gives 0 whatever its ``dy``)."""
        return self._adjoint(inputs, dy, mask, True)

    def _adjoint(
        self, inputs: torch.Tensor, dy: torch.Tensor, mask: torch.Tensor | None, by_block: bool
    ) -> torch.Tensor:
        if dy.dim() != 2 or dy.shape[0] != inputs.shape[0] or dy.shape[1] != self.n_out:
            raise ValueError(f"dy must be [{inputs.shape[0]}, {self.n_out}], got {dy.shape}")
        jac, row = self._linearised(inputs, mask, by_block, "adjoint")
        dy = torch.where(row.unsqueeze(1) != 0, dy.to(jac.dtype), torch.zeros_like(jac[:, :, 0]))
        products = jac.transpose(1, 2) * dy.unsqueeze(1)
        return _ordered_sum(products)

    def _blocks(
        self, x: torch.Tensor, want_jac: bool, by_block: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The network on normalised rows ``x`` ``[N, n_in]``, in blocks of ``block_rows`` rows
        (the last padded): every block is the same computation of the same shape, so a
        row's bits do not depend on the batch it came in, nor on the threads. ``by_block``
        runs them one after the other (small enough for one thread each: no split of
        an element-wise op between threads); otherwise all at once as one batched product
        (what torch.export traces: a loop over a dynamic count cannot be)."""
        n, n_in = x.shape[0], x.shape[1]
        size = self.block_rows
        count = (n + size - 1) // size
        # The last block is filled with copies of the last row (index_select, not a pad and
        # a slice: torch.export cannot prove n <= count * size for a symbolic n).
        fill = torch.arange(count * size, device=x.device).clamp(max=max(n - 1, 0))
        blocks = x.index_select(0, fill).reshape(count, size, n_in)
        weights = self._weights(x.dtype)
        biases = self._biases(x.dtype)
        if not by_block:
            y, jac = self._network(blocks, weights, biases, want_jac)
        else:
            ys: list[torch.Tensor] = []
            jacs: list[torch.Tensor] = []
            for k in range(count):
                y_k, jac_k = self._network(blocks[k], weights, biases, want_jac)
                ys.append(y_k)
                jacs.append(jac_k)
            empty = x.new_zeros(0, size, self.n_out)
            y = torch.cat(ys) if count > 0 else empty
            jac = torch.cat(jacs) if count > 0 and want_jac else empty
        kept = torch.arange(n, device=x.device)
        y = y.reshape(count * size, self.n_out).index_select(0, kept)
        if want_jac:
            jac = jac.reshape(count * size, self.n_out, n_in).index_select(0, kept)
        return y, jac

    def _network(
        self,
        blocks: torch.Tensor,
        weights: list[torch.Tensor],
        biases: list[torch.Tensor],
        want_jac: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalised outputs ``[..., R, n_out]`` of ``blocks`` ``[..., R, n_in]`` (one block
        ``[R, n_in]`` or a batch of them ``[B, R, n_in]``), and with ``want_jac``
        d(normalised output)/d(normalised input) as ``[..., R * n_out, n_in]``."""
        pre: list[torch.Tensor] = []
        h = blocks
        last = len(weights) - 1
        for i in range(len(weights)):
            h = _product(h, weights[i].t()) + biases[i]
            if i < last:
                pre.append(h)
                h = self._act(h)
        if not want_jac:
            return h, h
        # Back from the output: J = W_L diag(act'(z_L-1)) W_L-1 ... diag(act'(z_1)) W_1,
        # carried as [..., R, n_out, width]: cheap when n_out is small, as for aice.
        lead = list(blocks.shape[:-1])
        rows, n_out = blocks.shape[-2], self.n_out
        w_out = weights[last]
        jac = w_out.expand(lead + list(w_out.shape))
        for i in range(last - 1, -1, -1):
            scaled = jac * self._act_grad(pre[i]).unsqueeze(-2)
            # Lists joined with +: TorchScript has no starred list displays.
            flat = scaled.reshape(lead[:-1] + [rows * n_out, scaled.shape[-1]])  # noqa: RUF005
            sizes = lead + [n_out, weights[i].shape[1]]  # noqa: RUF005
            jac = _product(flat, weights[i]).reshape(sizes)
        # Explicit sizes, no -1: torch.export would have to rule out an empty block.
        return h, jac.reshape(lead[:-1] + [rows * n_out, jac.shape[-1]])  # noqa: RUF005

    def _prepare(self, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalised inputs in the compute dtype, and which rows hold real values.

        float32 and float64 are computed in their own precision (the weights are cast,
        9k numbers), any other dtype in the model's. A missing row (a NaN or fill value,
        or land) is computed at the mean instead, so nothing non-finite runs through the
        network."""
        if inputs.dim() != 2 or inputs.shape[1] != self.n_in:
            raise ValueError(
                "inputs must be [N, {}] ({}), got shape {}".format(
                    self.n_in, ", ".join(self.input_names), inputs.shape
                )
            )
        dtype = self.input_mean.dtype
        if inputs.dtype == torch.float32 or inputs.dtype == torch.float64:
            dtype = inputs.dtype
        x = inputs.to(dtype)
        valid = (x.abs() < self.fill_threshold).all(dim=1)  # False for NaN too
        columns = torch.tensor(self.land_columns, dtype=torch.long, device=x.device)
        land = (x.index_select(1, columns) == self.land_value).all(dim=1)
        valid = valid & ~land
        mean = self.input_mean.to(dtype)
        x = torch.where(valid.unsqueeze(1), x, mean.unsqueeze(0))
        return (x - mean) / self.input_std.to(dtype), valid

    def _weights(self, dtype: torch.dtype) -> list[torch.Tensor]:
        return [layer.weight.to(dtype) for layer in self.layers]  # type: ignore[misc]

    def _biases(self, dtype: torch.dtype) -> list[torch.Tensor]:
        return [layer.bias.to(dtype) for layer in self.layers]  # type: ignore[misc]


def _ordered_sum(products: torch.Tensor) -> torch.Tensor:
    """``products`` ``[N, a, b]`` summed over b, one column after the other: element-wise
    additions in a fixed order give the same bits for a row in any batch (a reduction
    kernel may split or vectorise its sum by the batch's size)."""
    total = products[:, :, 0]
    for k in range(1, products.shape[2]):
        total = total + products[:, :, k]
    return total


def _product(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``h @ w`` for one block ``[R, k]`` (a plain matrix product) or a batch of blocks
    ``[B, R, k]`` (one product per block: matmul would fold the blocks into one matrix)."""
    if h.dim() == 2:
        return torch.mm(h, w)
    return torch.bmm(h, w.unsqueeze(0).expand(h.shape[0], w.shape[0], w.shape[1]))
