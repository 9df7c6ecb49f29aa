"""Which points of a record become training rows, and their values.

Every mode selects only usable points (ocean, finite coordinates) with a finite ``aice``;
``sea_ice`` only those with ice. The fields are then converted at those candidates only,
not on the whole grid (the float64 copy, the fill test and the unit conversion of 15
quarter-degree fields were most of a file's reading time), and a candidate where an input
or the target is missing is dropped: the rows are the ones a whole-grid selection gives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from ufsemulator.data.ncread import GroupReader

FloatArray = npt.NDArray[np.float64]


class DataOptions(Protocol):
    """What the selection reads of ``ufsemulator.data.read.DataOptions``."""

    @property
    def mask(self) -> str: ...
    @property
    def thin(self) -> int: ...
    @property
    def target(self) -> str: ...
    @property
    def inputs(self) -> tuple[str, ...]: ...


def select_points(
    valid: npt.NDArray[np.bool_], aice: FloatArray, options: DataOptions
) -> npt.NDArray[np.intp]:
    """Flat indices of the selected points of a record whose ``valid`` points are known on
    the whole grid (``aice`` too)."""
    points = np.flatnonzero(valid)
    return points[chosen(aice.ravel()[points] > 0.0, options)]


def chosen(ice: npt.NDArray[np.bool_], options: DataOptions) -> npt.NDArray[np.intp]:
    """Which of a record's valid points (in grid order; ``ice``: whether each has ice) the
    mask mode and thinning keep, as positions among them."""
    if options.mask == "sea_ice":
        keep = np.flatnonzero(ice)
    elif options.mask == "ocean":
        keep = np.arange(ice.size)
    else:
        ice_at = np.flatnonzero(ice)
        water_at = np.flatnonzero(~ice)
        stride = max(1, water_at.size // max(1, ice_at.size))
        keep = np.union1d(ice_at, water_at[::stride])
    return keep[:: options.thin]


def select_record(
    reader: GroupReader, options: DataOptions, record: int, file: int
) -> dict[str, npt.NDArray[Any]]:
    """Rows of record ``record`` (of the reader's group, file number ``file`` of the
    series): inputs, target, coordinates, grid index, record and file of each."""
    grid = reader.grid
    usable = grid.usable_points
    usable_aice = reader.read_points("aice", record, usable)
    keep = np.isfinite(usable_aice)
    if options.mask == "sea_ice":
        keep &= usable_aice > 0.0
    points, aice_at = usable[keep], usable_aice[keep]
    values: dict[str, FloatArray] = {}
    complete = np.ones(points.size, dtype=bool)
    for name in dict.fromkeys((*options.inputs, options.target)):
        field = aice_at if name == "aice" else reader.read_points(name, record, points)
        complete &= np.isfinite(field)
        values[name] = field
    valid_at = np.flatnonzero(complete)  # positions among the points
    at = valid_at[chosen(aice_at[valid_at] > 0.0, options)]
    index = points[at]
    inputs = np.empty((index.size, len(options.inputs)), dtype=np.float32)
    for column, name in enumerate(options.inputs):
        inputs[:, column] = values[name][at]
    return {
        "inputs": inputs,
        "targets": values[options.target][at].astype(np.float32)[:, None],
        "lat": grid.lat.ravel()[index].astype(np.float32),
        "lon": grid.lon.ravel()[index].astype(np.float32),
        "index": index.astype(np.int64),
        "record": np.full(index.size, record, dtype=np.int64),
        "file": np.full(index.size, file, dtype=np.int64),
        "n_ocean": np.asarray(grid.n_ocean),
        "n_valid": np.asarray(valid_at.size),
    }
