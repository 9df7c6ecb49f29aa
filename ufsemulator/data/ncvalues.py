"""A netCDF variable's values as float64, every kind of missing value NaN.

netCDF4 masks ``_FillValue``, ``missing_value`` and values outside a valid range (and
unpacks ``scale_factor`` / ``add_offset``); ``read_float`` takes that mask, and |x| >= 1e20
(CICE's finite fill 1e30, where a file forgot to declare it) becomes NaN too. Where a float
variable is neither packed nor ranged, the same values can be found without netCDF4's
whole-grid mask: ``plain_fill_values`` names the values it would mask, so a reader looks
for them only at the points it keeps.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ufsemulator.errors import DataError

FloatArray = npt.NDArray[np.float64]

# Magnitudes this large are fill values even where a file forgot to declare them.
FILL_THRESHOLD = 1.0e20


def read_float(var: Any, record: int, path: Path) -> FloatArray:
    """Record ``record`` of ``var`` (a variable without a time axis: all of it) as float64,
    with every kind of missing value as NaN."""
    return as_float(raw_record(var, record, path))


def raw_record(var: Any, record: int, path: Path) -> Any:
    if var.ndim == 3:
        if record >= var.shape[0]:
            raise DataError(
                f"variable '{var.name}' in '{path}' has {var.shape[0]} records, "
                f"record {record} requested"
            )
        return var[record]
    return var[...]


def as_float(raw: Any) -> FloatArray:
    # netCDF4 masks _FillValue and missing_value itself (set_auto_mask is on by default).
    values = np.ma.filled(np.ma.asarray(raw).astype(np.float64), np.nan)
    values[np.abs(values) >= FILL_THRESHOLD] = np.nan
    return np.asarray(values)


_PACKED_OR_RANGED = frozenset(
    {"scale_factor", "add_offset", "valid_min", "valid_max", "valid_range", "_Unsigned"}
)


def plain_fill_values(var: Any) -> tuple[Any, ...] | None:
    """The values netCDF4 would mask in a float variable that is neither packed nor has a
    valid range (``_FillValue``, ``missing_value``, cast to the variable's type as netCDF4
    casts them); None for any other variable. Without a ``_FillValue`` netCDF4 masks the
    type's default fill (9.97e36), which the fill threshold catches anyway."""
    attrs = set(var.ncattrs())
    if var.dtype.kind != "f" or attrs & _PACKED_OR_RANGED:
        return None
    fills: list[Any] = []
    for name in ("_FillValue", "missing_value"):
        if name in attrs:
            fills += list(np.atleast_1d(np.asarray(var.getncattr(name), dtype=var.dtype)))
    return tuple(fill for fill in fills if not np.isnan(fill))  # NaN stays NaN anyway


def converted(var: Any, raw: npt.NDArray[Any], path: Path) -> FloatArray:
    """A grid variable as ``read_float`` reads it, from its stored values where netCDF4
    would only mask its fill values (no second read); else read again by netCDF4."""
    fills = plain_fill_values(var)
    if fills is None or var.ndim > 2:
        return read_float(var, 0, path)
    values = raw.astype(np.float64)
    for fill in fills:
        values[raw == fill] = np.nan
    values[np.abs(values) >= FILL_THRESHOLD] = np.nan
    return values


def no_chunk_cache(var: Any) -> None:
    """Read the variable's chunks straight into the array asked for: a record is read once,
    and HDF5's chunk cache (64 MB a variable) copied every quarter-degree chunk once more,
    into memory fresh for every variable of every file (30 thousand page faults a file of
    15 fields, a quarter of its reading time)."""
    if var.ndim < 3 or var.chunking() == "contiguous":
        return
    with contextlib.suppress(RuntimeError, AttributeError):  # netCDF-3 files: no HDF5
        var.set_var_chunk_cache(size=0, nelems=0, preemption=0.0)


def raw_variable(var: Any) -> tuple[dict[str, Any], npt.NDArray[Any]]:
    """A grid variable's attributes and stored values, unconverted (one copy, no mask)."""
    var.set_auto_maskandscale(False)
    try:
        values = np.asarray(var[...])
    finally:
        var.set_auto_maskandscale(True)
    return {name: var.getncattr(name) for name in var.ncattrs()}, values
