"""Read CICE history files (real or synthetic) into per-point training arrays.

One reader for both: variables are looked up by their CICE history names first
(``sst_h``), then by common alternatives (``sst``). Selected points become rows of
``inputs [N, 14]`` (order of ``INPUT_NAMES``) and ``targets [N, 1]``.

Mask modes (all of them only ever select ocean points, i.e. ``umask`` > 0.5 when the file
has a mask, and drop points where an input or the target is not finite):

- ``sea_ice``: points with ice, ``aice > 0``.
- ``ocean``: every ocean point.
- ``both``: every ice point plus an evenly strided sample of the open-water points, about
  as many as there are ice points. The model sees the ice edge from both sides without
  the open ocean (three quarters of a global grid) swamping the loss.

Thinning (``thin=k``) then keeps every k-th selected point in grid order. ``aice`` is
read whatever the target, since every mask mode needs it.

With ``cache_dir`` set, the selected arrays are kept in an ``.npz`` named by a hash of
the source file (resolved path, size, mtime) and the options, so a rerun skips netCDF.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import uuid
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import netCDF4
import numpy as np
import numpy.typing as npt

from ufsemulator.errors import DataError
from ufsemulator.synthetic import make_synthetic

__all__ = [
    "INPUT_NAMES",
    "MASK_MODES",
    "TARGET_NAMES",
    "DataError",
    "DataOptions",
    "Dataset",
    "load_dataset",
    "make_synthetic",
]

INPUT_NAMES: tuple[str, ...] = (
    "sst", "sss", "tair", "tsfc", "hi", "hs", "sice",
    "uocn", "vocn", "uatm", "vatm", "qref", "flwdn", "fswdn",
)  # fmt: skip
TARGET_NAMES: tuple[str, ...] = ("aice", "sst", "tair")
MASK_MODES: tuple[str, ...] = ("sea_ice", "ocean", "both")

# Names tried in order; the first is what CICE writes to its history files.
VARIABLE_NAMES: dict[str, tuple[str, ...]] = {
    "aice": ("aice_h", "aice", "siconc"),
    "sst": ("sst_h", "sst", "SST"),
    "sss": ("sss_h", "sss", "SSS"),
    "tair": ("Tair_h", "Tair", "tair"),
    "tsfc": ("Tsfc_h", "Tsfc", "tsfc"),
    "hi": ("hi_h", "hi"),
    "hs": ("hs_h", "hs"),
    "sice": ("sice_h", "sice"),
    "uocn": ("uocn_h", "uocn"),
    "vocn": ("vocn_h", "vocn"),
    "uatm": ("uatm_h", "uatm"),
    "vatm": ("vatm_h", "vatm"),
    "qref": ("Qref_h", "Qref", "qref"),
    "flwdn": ("flwdn_h", "flwdn", "flw"),
    "fswdn": ("fswdn_h", "fswdn", "fsw"),
    "lat": ("ULAT", "TLAT", "lat", "latitude"),
    "lon": ("ULON", "TLON", "lon", "longitude"),
    "mask": ("umask", "tmask", "mask"),
}

# Magnitudes this large are fill values even where a file forgot to declare them.
_FILL_THRESHOLD = 1.0e20
_CACHE_VERSION = 1

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class DataOptions:
    mask: str = "sea_ice"
    thin: int = 1
    target: str = "aice"
    cache_dir: Path | None = None
    time_index: int = 0  # record of the time axis to read

    def __post_init__(self) -> None:
        if self.mask not in MASK_MODES:
            raise ValueError(f"mask must be one of {', '.join(MASK_MODES)}, got {self.mask!r}")
        if self.target not in TARGET_NAMES:
            raise ValueError(
                f"target must be one of {', '.join(TARGET_NAMES)}, got {self.target!r}"
            )
        if isinstance(self.thin, bool) or not isinstance(self.thin, int) or self.thin < 1:
            raise ValueError(f"thin must be an integer >= 1, got {self.thin!r}")
        if self.time_index < 0:
            raise ValueError(f"time_index must be >= 0, got {self.time_index}")
        if self.cache_dir is not None and not isinstance(self.cache_dir, Path):
            object.__setattr__(self, "cache_dir", Path(self.cache_dir))

    def cache_key_fields(self) -> dict[str, Any]:
        """The options that change the arrays (not where they are cached)."""
        return {"mask": self.mask, "thin": self.thin, "target": self.target,
                "time_index": self.time_index}  # fmt: skip


@dataclass(frozen=True, eq=False)
class Dataset:
    """Selected points of one history file; rows of all arrays correspond."""

    inputs: npt.NDArray[np.float32]  # [N, 14], columns in INPUT_NAMES order, physical units
    targets: npt.NDArray[np.float32]  # [N, 1]
    lat: npt.NDArray[np.float32]  # [N] degrees north
    lon: npt.NDArray[np.float32]  # [N] degrees east
    index: npt.NDArray[np.int64]  # [N] flat (row-major) index into the nj x ni grid
    grid_shape: tuple[int, int]  # (nj, ni)
    target_names: tuple[str, ...]
    source: str
    input_names: tuple[str, ...] = INPUT_NAMES

    def __len__(self) -> int:
        return int(self.inputs.shape[0])


def load_dataset(path: str | Path, options: DataOptions | None = None) -> Dataset:
    """Select and flatten the points of the history file at ``path``.

    Raises ``DataError`` (naming the file, and the variable where one is missing) when
    the file cannot be read or holds no selected point.
    """
    options = options or DataOptions()
    source = Path(path)
    try:
        stat = source.stat()
    except OSError as exc:
        raise DataError(f"cannot read data file '{source}': {exc.strerror}") from exc
    cache_file = None
    if options.cache_dir is not None:
        cache_file = _cache_path(source, stat, options)
        cached = _load_cache(cache_file)
        if cached is not None:
            return dataclasses.replace(cached, source=str(source))
    dataset = _read(source, options)
    if cache_file is not None:
        _save_cache(cache_file, dataset)
    return dataset


def _read(path: Path, options: DataOptions) -> Dataset:
    try:
        nc = netCDF4.Dataset(path, "r")
    except OSError as exc:
        raise DataError(f"cannot open '{path}' as netCDF: {exc}") from exc
    with nc:
        fields = {name: _field(nc, path, name, options.time_index) for name in INPUT_NAMES}
        aice = _field(nc, path, "aice", options.time_index)
        target = aice if options.target == "aice" else fields[options.target]
        shape = aice.shape
        lat = _coordinate(nc, path, "lat", shape)
        lon = _coordinate(nc, path, "lon", shape)
        mask_name = _find(nc, "mask")
        ocean = (
            _to_float(nc.variables[mask_name], options.time_index, path) > 0.5
            if mask_name is not None
            else np.ones(shape, dtype=bool)
        )
    for name, values in fields.items():
        if values.shape != shape:
            raise DataError(
                f"variable for '{name}' in '{path}' has shape {values.shape}, "
                f"expected {shape} like aice"
            )
    if ocean.shape != shape:
        raise DataError(f"mask '{mask_name}' in '{path}' has shape {ocean.shape}, expected {shape}")

    stacked = np.stack([fields[name] for name in INPUT_NAMES], axis=-1)
    valid = ocean & np.isfinite(stacked).all(axis=-1) & np.isfinite(target)
    valid &= np.isfinite(lat) & np.isfinite(lon)
    # Every mode looks at aice to tell ice from open water; a missing aice is no point.
    valid &= np.isfinite(aice)
    index = _select(valid.ravel(), aice.ravel(), options)
    if index.size == 0:
        raise DataError(
            f"no points selected from '{path}' with mask '{options.mask}' "
            f"(ocean points: {int(ocean.sum())}, valid: {int(valid.sum())})"
        )
    return Dataset(
        inputs=stacked.reshape(-1, len(INPUT_NAMES))[index].astype(np.float32),
        targets=target.ravel()[index].astype(np.float32)[:, None],
        lat=lat.ravel()[index].astype(np.float32),
        lon=lon.ravel()[index].astype(np.float32),
        index=index.astype(np.int64),
        grid_shape=(int(shape[0]), int(shape[1])),
        target_names=(options.target,),
        source=str(path),
    )


def _select(
    valid: npt.NDArray[np.bool_], aice: FloatArray, options: DataOptions
) -> npt.NDArray[np.intp]:
    ice = valid & (aice > 0.0)
    if options.mask == "sea_ice":
        index = np.flatnonzero(ice)
    elif options.mask == "ocean":
        index = np.flatnonzero(valid)
    else:
        ice_index = np.flatnonzero(ice)
        water_index = np.flatnonzero(valid & ~ice)
        stride = max(1, water_index.size // max(1, ice_index.size))
        index = np.union1d(ice_index, water_index[::stride])
    return index[:: options.thin]


def _find(nc: Any, name: str) -> str | None:
    return next((cand for cand in VARIABLE_NAMES[name] if cand in nc.variables), None)


def _field(nc: Any, path: Path, name: str, time_index: int) -> FloatArray:
    found = _find(nc, name)
    if found is None:
        tried = ", ".join(VARIABLE_NAMES[name])
        raise DataError(f"'{path}' has no variable for '{name}' (tried: {tried})")
    values = _to_float(nc.variables[found], time_index, path)
    if values.ndim != 2:
        raise DataError(
            f"variable '{found}' in '{path}' has shape {values.shape}, expected (nj, ni) "
            "or (time, nj, ni)"
        )
    return values


def _to_float(var: Any, time_index: int, path: Path) -> FloatArray:
    if var.ndim == 3:
        if time_index >= var.shape[0]:
            raise DataError(
                f"variable '{var.name}' in '{path}' has {var.shape[0]} time records, "
                f"time_index {time_index} requested"
            )
        raw = var[time_index]
    else:
        raw = var[...]
    values = np.ma.filled(np.ma.asarray(raw).astype(np.float64), np.nan)
    values[np.abs(values) >= _FILL_THRESHOLD] = np.nan
    return np.asarray(values)


def _coordinate(nc: Any, path: Path, name: str, shape: Sequence[int]) -> FloatArray:
    found = _find(nc, name)
    if found is None:
        tried = ", ".join(VARIABLE_NAMES[name])
        raise DataError(f"'{path}' has no variable for '{name}' (tried: {tried})")
    values = _to_float(nc.variables[found], 0, path)
    if values.ndim == 1:  # a regular grid stores lat(nj) and lon(ni)
        axis = 0 if name == "lat" else 1
        if values.size != shape[axis]:
            raise DataError(
                f"coordinate '{found}' in '{path}' has {values.size} values, expected {shape[axis]}"
            )
        values = np.broadcast_to(
            values[:, None] if axis == 0 else values[None, :], tuple(shape)
        ).copy()
    if tuple(values.shape) != tuple(shape):
        raise DataError(
            f"coordinate '{found}' in '{path}' has shape {values.shape}, expected {tuple(shape)}"
        )
    return values


def _cache_path(source: Path, stat: os.stat_result, options: DataOptions) -> Path:
    assert options.cache_dir is not None
    key = {
        "version": _CACHE_VERSION,
        "source": str(source.resolve()),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "options": options.cache_key_fields(),
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return options.cache_dir / f"{source.stem}.{digest}.npz"


def _load_cache(path: Path) -> Dataset | None:
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            return Dataset(
                inputs=z["inputs"], targets=z["targets"], lat=z["lat"], lon=z["lon"],
                index=z["index"], grid_shape=tuple(meta["grid_shape"]),
                target_names=tuple(meta["target_names"]), source=meta["source"],
                input_names=tuple(meta["input_names"]),
            )  # fmt: skip
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return None  # a damaged cache is rebuilt, not fatal


def _save_cache(path: Path, dataset: Dataset) -> None:
    meta = {
        "grid_shape": list(dataset.grid_shape),
        "target_names": list(dataset.target_names),
        "input_names": list(dataset.input_names),
        "source": dataset.source,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_name = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp_name, "xb") as out:
            np.savez(
                out, meta=np.array(json.dumps(meta)), inputs=dataset.inputs,
                targets=dataset.targets, lat=dataset.lat, lon=dataset.lon, index=dataset.index,
            )  # fmt: skip
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
