"""A series' grid: coordinates and ocean mask, converted once, and what they came from.

A file's grid variables are read raw (a copy, no conversion) and compared bit for bit,
with their names and attributes, to the previous file's; the converted grid is reused
where all of them are the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, eq=False)
class Grid:
    """A group's coordinates and ocean mask (converted), and what they were read from:
    per grid variable its name, attributes and raw values."""

    lat: FloatArray
    lon: FloatArray
    ocean: BoolArray
    # Flat indices of the ocean points with finite coordinates: the only points selected.
    usable_points: npt.NDArray[np.intp]
    n_ocean: int
    notes: tuple[str, ...]
    raw: tuple[tuple[str, dict[str, Any], npt.NDArray[Any]], ...]

    def same_source(self, raw: tuple[tuple[str, dict[str, Any], npt.NDArray[Any]], ...]) -> bool:
        """Whether ``raw`` names the same variables with the same attributes and values."""
        return len(raw) == len(self.raw) and all(
            name == other_name
            and _same_attributes(attrs, other_attrs)
            and values.dtype == other_values.dtype
            and np.array_equal(_bits(values), _bits(other_values))
            for (name, attrs, values), (other_name, other_attrs, other_values) in zip(
                raw, self.raw, strict=True
            )
        )


def _bits(values: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """The values' bit patterns: equal bits are equal values, NaN included."""
    if values.dtype.kind == "f":
        return values.view(f"u{values.dtype.itemsize}")
    return values


def _same_attributes(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
