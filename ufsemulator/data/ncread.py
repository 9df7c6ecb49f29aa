"""Find our fields in netCDF files nobody here wrote, and read them in our units.

A *group* is the files that hold one stretch of time together: a CICE history file alone,
or an ocean/ice file with its atmosphere file. For each field the group's files are
searched in order, and in each file, in order:

1. the CICE history name with the file's stream suffix (``aice_d`` in a daily file): the
   suffix is found by counting which of ``_h``, ``_d``, none, ``_m``, ``_y``, ``_1`` most
   CICE names carry, so a field is never taken from another stream by accident;
2. the CICE name with the other suffixes, then other common names (``SST``, ``flw``);
3. a CF standard name (or JEDI's) as the variable's name, then as its ``standard_name``.

Values are read as float64; ``_FillValue``, ``missing_value``, NaN and |x| >= 1e20 (CICE's
finite fill 1e30, where a file forgot to declare it) become NaN. A field in K or kg/kg is
converted to degC or g/kg, the units the emulator is trained in.

The grid is the T-point one (``TLAT``, ``TLON``, ``tmask``), where CICE keeps ``aice``,
``hi``, ``sst`` and the other scalars; U points (``ULAT``, ``ULON``, ``umask``) only where
a file has nothing else, and a note says so: ``umask`` drops the coastal T cells.

A series of files shares its grid: a reader given the previous file's ``Grid`` reads the
grid variables' raw values (a copy, no conversion) and reuses the converted grid where
names, attributes and values are all the same. A field is read whole (one contiguous
read) but converted only at the points asked for (``read_points``): a sea-ice selection
is a few percent of the grid.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import netCDF4
import numpy as np
import numpy.typing as npt

from ufsemulator.data.grid import Grid
from ufsemulator.data.ncvalues import (
    FILL_THRESHOLD,
    as_float,
    converted,
    no_chunk_cache,
    plain_fill_values,
    raw_record,
    raw_variable,
)
from ufsemulator.data.onceread import FileBytes, read_file
from ufsemulator.errors import DataError
from ufsemulator.variables import (
    CF_NAMES,
    CICE_NAMES,
    CICE_SUFFIXES,
    INPUT_NAMES,
    OTHER_NAMES,
    UNITS,
    canonical_unit,
    conversion,
)

FloatArray = npt.NDArray[np.float64]

# Grid variables, T points first; a name in _U_POINTS is used only when nothing else is there.
GRID_NAMES: dict[str, tuple[str, ...]] = {
    "lat": ("TLAT", "lat", "latitude", "ULAT"),
    "lon": ("TLON", "lon", "longitude", "ULON"),
    "mask": ("tmask", "mask", "umask"),
}
_U_POINTS = ("ULAT", "ULON", "umask")


@dataclass(frozen=True)
class Found:
    """Where a field is: file number in the group, variable, conversion to our units."""

    file: int
    variable: str
    scale: float = 1.0
    offset: float = 0.0


def detect_suffix(variables: Sequence[str]) -> str | None:
    """The CICE stream suffix most CICE field names in ``variables`` carry; None if none."""
    present = set(variables)
    counts = {
        s: sum(f"{base}{s}" in present for base in CICE_NAMES.values()) for s in CICE_SUFFIXES
    }
    best = max(CICE_SUFFIXES, key=lambda s: counts[s])  # ties: the earlier suffix
    return best if counts[best] else None


def candidate_names(name: str, suffix: str | None) -> list[str]:
    """Variable names tried for ``name`` in a file whose stream suffix is ``suffix``."""
    order = [suffix] if suffix is not None else []
    order += [s for s in CICE_SUFFIXES if s != suffix]
    plain = [CICE_NAMES[name] + s for s in order] + list(OTHER_NAMES.get(name, ()))
    return plain + [n for n in CF_NAMES.get(name, ()) if n not in plain]


class GroupReader:
    """The open files of one group; :meth:`fields` reads one record of the needed fields."""

    def __init__(
        self,
        files: Sequence[Path],
        names: Sequence[str],
        grid: bool = True,
        known: Grid | None = None,
    ) -> None:
        """``grid=False``: only find the fields and count the records (no array is read;
        ``grid``, ``lat``, ``lon`` and ``ocean`` are then not set). ``known``: the grid of
        the previous group, reused where this group's grid variables are the same."""
        self.files = tuple(files)
        self.names = tuple(names)
        self.notes: list[str] = []
        self._stack = contextlib.ExitStack()
        self._nc: list[Any] = []
        # What is read (grid=True) is each file's bytes read once and hashed on the way
        # (ufsemulator.data.onceread), parsed from memory; counting records reads no values.
        self.read: list[FileBytes] = []
        try:
            for path in self.files:
                self._nc.append(self._stack.enter_context(self._open(path, grid)))
            self.found = self._resolve()
            for found in self.found.values():
                no_chunk_cache(self._nc[found.file].variables[found.variable])
            self.n_records = self._count_records()
            if grid:
                self.grid = self._grid(known)
                self.notes += self.grid.notes
                self.lat, self.lon, self.ocean = self.grid.lat, self.grid.lon, self.grid.ocean
        except BaseException:
            self._stack.close()
            raise

    def _open(self, path: Path, whole: bool) -> Any:
        try:
            if not whole:
                return netCDF4.Dataset(path, "r")
            found = read_file(path)
            self.read.append(found)
            return netCDF4.Dataset(str(path), "r", memory=found.data)
        except OSError as exc:
            raise DataError(f"cannot open '{path}' as netCDF: {exc}") from exc

    def __enter__(self) -> GroupReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    @property
    def where(self) -> str:
        return " + ".join(f"'{path}'" for path in self.files)

    def time_of(self, record: int) -> str | None:
        """Record ``record``'s time, ISO 8601 (as its ``time`` variable's units and
        calendar say), or None where the group has no such variable."""
        for nc in self._nc:
            var = nc.variables.get("time")
            if var is None or var.ndim != 1 or record >= var.shape[0]:
                continue
            value = var[record]
            units = getattr(var, "units", None)
            if units is None:
                return str(float(value))
            when: Any = netCDF4.num2date(value, units, getattr(var, "calendar", "standard"))
            return str(when.isoformat())
        return None

    def fields(self, record: int) -> dict[str, FloatArray]:
        """Record ``record`` of every needed field, in our units, land and fill as NaN."""
        return {name: self.read_field(name, record) for name in self.found}

    def read_field(self, name: str, record: int) -> FloatArray:
        """Record ``record`` of field ``name`` on the whole grid, as ``fields`` reads it."""
        found = self.found[name]
        raw = self._record(found, record)
        return _in_our_units(as_float(raw), found)

    def read_points(self, name: str, record: int, points: npt.NDArray[np.intp]) -> FloatArray:
        """Record ``record`` of field ``name`` at the flat grid indices ``points`` only:
        the values ``read_field(name, record).ravel()[points]`` would give."""
        found = self.found[name]
        var = self._nc[found.file].variables[found.variable]
        fills = plain_fill_values(var)
        if fills is None:  # packed, a valid range, unsigned: netCDF4 masks it
            raw = self._record(found, record)
            values = np.ma.getdata(raw).reshape(-1)[points].astype(np.float64)
            mask = np.ma.getmask(raw)
            if mask is not np.ma.nomask:
                values[mask.reshape(-1)[points]] = np.nan
        else:
            # The stored values, and only at the points the fill values are looked for:
            # netCDF4's mask of the whole grid cost five times the read itself.
            var.set_auto_maskandscale(False)
            try:
                stored = self._record(found, record).reshape(-1)[points]
            finally:
                var.set_auto_maskandscale(True)
            values = stored.astype(np.float64)
            for fill in fills:
                values[stored == fill] = np.nan
        values[np.abs(values) >= FILL_THRESHOLD] = np.nan
        return _in_our_units(values, found)

    def _record(self, found: Found, record: int) -> Any:
        """The record as netCDF4 reads it (masked unless switched off), its shape checked
        against the grid."""
        var = self._nc[found.file].variables[found.variable]
        raw = raw_record(var, record, self.files[found.file])
        if raw.shape != self.lat.shape:
            raise DataError(
                f"variable '{found.variable}' in '{self.files[found.file]}' has shape "
                f"{raw.shape}, expected {self.lat.shape} like the grid"
            )
        return raw

    def _resolve(self) -> dict[str, Found]:
        suffixes = [detect_suffix(list(nc.variables)) for nc in self._nc]
        self.notes += [
            f"CICE history names with stream suffix '{suffix or '(none)'}'"
            for suffix in suffixes
            if suffix is not None
        ]
        found: dict[str, Found] = {}
        missing: list[str] = []
        for name in self.names:
            hit = self._find(name, suffixes)
            if hit is None:
                tried = candidate_names(name, suffixes[0])
                missing.append(f"'{name}' (tried: {', '.join(tried)}; also as standard_name)")
            else:
                found[name] = hit
        if missing:
            # A model can be trained without an input the files lack; not without aice.
            lacking = [name for name in self.names if name not in found]
            hint = (
                "; inputs can be left out with data.inputs"
                if any(name in INPUT_NAMES for name in lacking)
                else ""
            )
            verb = "lacks" if len(self.files) == 1 else "lack"
            raise DataError(
                f"{self.where} {verb} {len(missing)} needed field(s): {'; '.join(missing)}{hint}"
            )
        return found

    def _find(self, name: str, suffixes: Sequence[str | None]) -> Found | None:
        for index, (nc, suffix) in enumerate(zip(self._nc, suffixes, strict=True)):
            variables = nc.variables
            by_name = next((c for c in candidate_names(name, suffix) if c in variables), None)
            if by_name is None:
                standard = CF_NAMES.get(name, ())
                by_name = next(
                    (
                        v
                        for v in variables
                        if getattr(variables[v], "standard_name", None) in standard
                    ),
                    None,
                )
            if by_name is not None:
                return self._with_units(index, by_name, name)
        return None

    def _with_units(self, index: int, variable: str, name: str) -> Found:
        units = getattr(self._nc[index].variables[variable], "units", None)
        expected = UNITS[name]
        if not isinstance(units, str) or not units.strip():
            return Found(index, variable)
        if canonical_unit(units) is None:
            self.notes.append(f"units '{units}' of '{variable}' not recognised: read as {expected}")
            return Found(index, variable)
        factor = conversion(units, expected)
        if factor is None:
            raise DataError(
                f"variable '{variable}' in '{self.files[index]}' has units '{units}', "
                f"expected {expected} (or units convertible to it)"
            )
        if factor != (1.0, 0.0):
            self.notes.append(f"'{variable}' converted from {units} to {expected}")
        return Found(index, variable, *factor)

    def _count_records(self) -> int:
        counts = {}
        for found in self.found.values():
            var = self._nc[found.file].variables[found.variable]
            if var.ndim == 3:
                counts[f"{found.variable} in '{self.files[found.file]}'"] = int(var.shape[0])
        if len(set(counts.values())) > 1:
            listed = ", ".join(f"{k}: {v}" for k, v in counts.items())
            raise DataError(f"fields of {self.where} differ in their number of records ({listed})")
        return next(iter(counts.values()), 1)

    def _grid(self, known: Grid | None) -> Grid:
        first = next(iter(self.found.values()))
        var = self._nc[first.file].variables[first.variable]
        # The shape from the metadata: reading a record only to learn it costs a field.
        shape = tuple(var.shape[1:] if var.ndim == 3 else var.shape)
        if len(shape) != 2:
            raise DataError(
                f"variable '{first.variable}' in '{self.files[first.file]}' has shape {shape}"
                " after the time axis, expected (nj, ni)"
            )
        chosen: dict[str, tuple[int, str] | None] = {
            key: next(
                ((i, n) for n in names for i, nc in enumerate(self._nc) if n in nc.variables), None
            )
            for key, names in GRID_NAMES.items()
        }
        raw_by_key = {
            key: (hit[1], *raw_variable(self._nc[hit[0]].variables[hit[1]]))
            for key, hit in chosen.items()
            if hit is not None
        }
        raw = tuple(raw_by_key.values())
        if known is not None and known.lat.shape == shape and known.same_source(raw):
            return known
        notes: list[str] = []
        used_u = [hit[1] for hit in chosen.values() if hit is not None and hit[1] in _U_POINTS]
        if used_u:
            notes.append(
                f"no T-point grid: using the U-point {', '.join(used_u)} for T-point fields "
                "(umask drops coastal T cells)"
            )
        coords = []
        for key in ("lat", "lon"):
            hit = chosen[key]
            if hit is None:
                raise DataError(
                    f"{self.where} have no {key} coordinate (tried: {', '.join(GRID_NAMES[key])})"
                )
            coords.append(self._coordinate(*hit, key, shape, raw_by_key[key][2]))
        lat, lon = coords
        mask_hit = chosen["mask"]
        if mask_hit is None:
            notes.append("no land mask (tmask): land is where a field is missing")
            ocean = np.ones(shape, dtype=bool)
        else:
            mask = converted(
                self._nc[mask_hit[0]].variables[mask_hit[1]],
                raw_by_key["mask"][2],
                self.files[mask_hit[0]],
            )
            if mask.shape != shape:
                raise DataError(
                    f"mask '{mask_hit[1]}' in '{self.files[mask_hit[0]]}' has shape "
                    f"{mask.shape}, expected {shape}"
                )
            ocean = mask > 0.5
        usable = np.flatnonzero(ocean & np.isfinite(lat) & np.isfinite(lon))
        return Grid(lat, lon, ocean, usable, int(ocean.sum()), tuple(notes), raw)

    def _coordinate(
        self, index: int, name: str, key: str, shape: tuple[int, ...], raw: npt.NDArray[Any]
    ) -> FloatArray:
        path = self.files[index]
        values = converted(self._nc[index].variables[name], raw, path)
        if values.ndim == 1:  # a regular grid stores lat(nj) and lon(ni)
            axis = 0 if key == "lat" else 1
            if values.size != shape[axis]:
                raise DataError(
                    f"coordinate '{name}' in '{path}' has {values.size} values, "
                    f"expected {shape[axis]}"
                )
            values = np.broadcast_to(
                values[:, None] if axis == 0 else values[None, :], shape
            ).copy()
        if values.shape != shape:
            raise DataError(
                f"coordinate '{name}' in '{path}' has shape {values.shape}, expected {shape}"
            )
        return values


def _in_our_units(values: FloatArray, found: Found) -> FloatArray:
    if (found.scale, found.offset) != (1.0, 0.0):
        return values * found.scale + found.offset
    return values
