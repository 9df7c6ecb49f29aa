"""Synthetic data in each file layout the reader meets in practice.

- A CICE history stream (:func:`write_cice`): fields named ``aice_h`` (hourly),
  ``aice_d`` (daily), ``aice`` (monthly, the first stream) ...; T-point grid ``TLAT``,
  ``TLON``, ``tmask`` and U-point grid ``ULAT``, ``ULON``, ``umask``; one or more records.
- The CF-named pair (:func:`write_cf_pair`): an ocean/ice file and an atmosphere file on a
  regular grid with 1-D ``lat``/``lon``, variables named or tagged by CF standard names,
  temperatures of the atmosphere and the ice surface in K, humidity in kg/kg, no mask
  variable (land is missing in the ocean file), as a JEDI interpolation writes them.
- Several files (:func:`write_layout` with ``files > 1``): a time series, one file after
  the other, numbered ``<stem>.0001.nc``, ...

Record ``g`` of a series (counted over all files) holds the fields of seed ``seed + 7919 g``
on the land mask of ``seed``, so records differ and the coastline does not move. With
``seasonal``, record ``g`` also lies ``g`` record intervals after 1 January in the seasonal
cycle (``synthetic_fields(day_of_year=...)``): sun, air and sea temperatures, and with
them the ice, evolve through the series.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from ufsemulator.data.synthetic import (
    DAY_OF_YEAR,
    EARTH_RADIUS,
    FILL_VALUE,
    VARIABLES,
    FloatArray,
    solar_declination,
    synthetic_fields,
    synthetic_grid,
)
from ufsemulator.errors import DataError

if TYPE_CHECKING:
    import netCDF4
from ufsemulator.variables import CICE_SUFFIXES

# layout -> CICE stream suffix (None: the CF pair) and days between records.
LAYOUTS: dict[str, tuple[str | None, float]] = {
    "hourly": ("_h", 1.0 / 24.0),
    "daily": ("_d", 1.0),
    "monthly": ("", 31.0),
    "cf": (None, 1.0 / 4.0),
}
_SEED_STRIDE = 7919
_VELOCITIES = ("uocn", "vocn", "uatm", "vatm")
# The CF pair: history name -> (file, variable name, standard_name, units).
_CF_VARIABLES: dict[str, tuple[str, str, str, str]] = {
    "sst_h": (
        "ocean",
        "sea_water_potential_temperature",
        "sea_water_potential_temperature",
        "degC",
    ),
    "sss_h": ("ocean", "sea_water_salinity", "sea_water_salinity", "psu"),
    "aice_h": ("ocean", "sea_ice_area_fraction", "sea_ice_area_fraction", "1"),
    "hi_h": ("ocean", "sea_ice_volume", "sea_ice_thickness", "m"),
    "hs_h": ("ocean", "sea_ice_snow_volume", "surface_snow_thickness", "m"),
    "sice_h": ("ocean", "sea_ice_salinity", "sea_ice_salinity", "ppt"),
    # Named by the model, found by its standard_name.
    "Tsfc_h": ("ocean", "tsurf", "sea_ice_surface_temperature", "K"),
    "uocn_h": ("ocean", "uo", "sea_water_x_velocity", "m s-1"),
    "vocn_h": ("ocean", "vo", "sea_water_y_velocity", "m s-1"),
    "Tair_h": ("atmosphere", "air_temperature", "air_temperature", "K"),
    "Qref_h": ("atmosphere", "specific_humidity", "specific_humidity", "kg kg-1"),
    "uatm_h": ("atmosphere", "eastward_wind", "eastward_wind", "m s-1"),
    "vatm_h": ("atmosphere", "northward_wind", "northward_wind", "m s-1"),
    "flwdn_h": (
        "atmosphere",
        "surface_downwelling_longwave_flux_in_air",
        "surface_downwelling_longwave_flux_in_air",
        "W m-2",
    ),
    "fswdn_h": (
        "atmosphere",
        "surface_downwelling_shortwave_flux_in_air",
        "surface_downwelling_shortwave_flux_in_air",
        "W m-2",
    ),
}
# Applied to the (degC, g/kg) fields for the units above.
_TO_CF_UNITS = {"K": (1.0, 273.15), "kg kg-1": (1.0e-3, 0.0)}

Records = list[dict[str, FloatArray]]


def make_synthetic(
    path: str | Path,
    ni: int = 384,
    nj: int = 320,
    seed: int = 0,
    *,
    suffix: str = "_h",
    records: int = 1,
) -> Path:
    """Write a synthetic CICE history file at ``path`` (atomically) and return its path.

    ``suffix`` is the stream's ("_h" hourly, "_d" daily, "" monthly); ``records`` the
    length of its time axis. Other layouts: ``write_layout``."""
    return write_cice(path, ni=ni, nj=nj, seed=seed, suffix=suffix, records=records)


def write_layout(
    out: str | Path,
    layout: str,
    ni: int,
    nj: int,
    seed: int = 0,
    records: int = 1,
    files: int = 1,
    seasonal: bool = False,
) -> list[Path]:
    """Write ``files`` files of ``records`` records each in ``layout``; their paths in time
    order (for the CF pair: ocean/ice file, then its atmosphere file, for each time)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if records < 1 or files < 1:
        raise ValueError(f"records and files must be >= 1, got {records} and {files}")
    out = Path(out)
    written: list[Path] = []
    for k in range(files):
        path = out if files == 1 else out.with_name(f"{out.stem}.{k + 1:04d}{out.suffix}")
        first = k * records
        if layout == "cf":
            atm = path.with_name(f"{path.stem}_atm{path.suffix}")
            written += write_cf_pair(path, atm, ni, nj, seed, records, first)
        else:
            suffix = LAYOUTS[layout][0] or ""
            written.append(write_cice(path, ni, nj, seed, suffix, records, first, layout, seasonal))
    return written


def write_cice(  # noqa: PLR0913 - keyword defaults of a file generator, called positionally
    path: str | Path,
    ni: int = 384,
    nj: int = 320,
    seed: int = 0,
    suffix: str = "_h",
    records: int = 1,
    first_record: int = 0,
    layout: str | None = None,
    seasonal: bool = False,
) -> Path:
    """One CICE history file with fields ``<name><suffix>`` and ``records`` records."""
    if suffix not in CICE_SUFFIXES:
        raise ValueError(f"suffix must be one of {CICE_SUFFIXES}, got {suffix!r}")
    layout = layout or next((k for k, v in LAYOUTS.items() if v[0] == suffix), "daily")
    days = LAYOUTS[layout][1] if seasonal else 0.0
    lat, lon, ocean, series = _series(ni, nj, seed, records, first_record, days)

    def write(ds: netCDF4.Dataset) -> None:
        ds.title = "synthetic CICE-style sea ice history (ufsemulator)"
        ds.source = "ufsemulator.data.synthfiles.write_cice"
        ds.conventions = "CF-1.0"
        ds.comment = "All fields synthetic; physically coupled but not a model run."
        ds.seed = np.int32(seed)
        ds.solar_declination_deg = solar_declination()
        ds.createDimension("nj", nj)
        ds.createDimension("ni", ni)
        _time_axis(ds, layout, records, first_record)
        _cice_grid(ds, lat, lon, ocean)
        _cice_fields(ds, series, ocean, suffix)

    return _atomic(Path(path), write)


def _cice_grid(
    ds: netCDF4.Dataset, lat: FloatArray, lon: FloatArray, ocean: npt.NDArray[np.bool_]
) -> None:
    """CICE's grid variables: T and U points' coordinates and masks, the cell areas."""
    nj, ni = lat.shape
    u_lat, u_lon, u_ocean = _u_grid(lat, lon, ocean)
    for name, values, long_name, units in (
        ("TLAT", lat, "T grid center latitude", "degrees_north"),
        ("TLON", lon, "T grid center longitude", "degrees_east"),
        ("ULAT", u_lat, "U grid center latitude", "degrees_north"),
        ("ULON", u_lon, "U grid center longitude", "degrees_east"),
    ):
        var = ds.createVariable(name, "f4", ("nj", "ni"))
        var.long_name, var.units = long_name, units
        var[:] = values.astype(np.float32)
    for name, mask, where in (("tmask", ocean, "T"), ("umask", u_ocean, "U")):
        var = ds.createVariable(name, "f4", ("nj", "ni"))
        var.long_name = f"ocean grid mask for {where} points"
        var.coordinates = f"{where}LON {where}LAT"
        var.comment = "0 = land, 1 = ocean"
        var[:] = mask.astype(np.float32)
    tarea = ds.createVariable("tarea", "f4", ("nj", "ni"))
    tarea.long_name, tarea.units = "area of T grid cells", "m^2"
    dlat, dlon = np.deg2rad(170.0 / nj), np.deg2rad(360.0 / ni)
    tarea[:] = (EARTH_RADIUS**2 * np.cos(np.deg2rad(lat)) * dlat * dlon).astype(np.float32)


def _cice_fields(
    ds: netCDF4.Dataset, series: Records, ocean: npt.NDArray[np.bool_], suffix: str
) -> None:
    """The history fields ``<name><suffix>``, one record per entry of ``series``, land
    masked."""
    for key, (long_name, units, standard_name) in VARIABLES.items():
        base = key.removesuffix("_h")
        var = ds.createVariable(base + suffix, "f4", ("time", "nj", "ni"), fill_value=FILL_VALUE)
        var.units, var.long_name = units, long_name
        if standard_name is not None:
            var.standard_name = standard_name
        # CICE keeps velocities on U points, the scalars on T points.
        var.coordinates = "ULON ULAT" if base.lower() in _VELOCITIES else "TLON TLAT"
        var.cell_measures = "area: tarea"
        var.cell_methods = "time: mean"
        var.time_rep = "instantaneous" if suffix == "_h" else "averaged"
        var.missing_value = FILL_VALUE
        for r, fields in enumerate(series):
            data = fields[key].astype(np.float32)
            var[r, :, :] = np.ma.masked_array(data, mask=~ocean)


def write_cf_pair(
    ocean_path: str | Path,
    atmosphere_path: str | Path,
    ni: int = 384,
    nj: int = 320,
    seed: int = 0,
    records: int = 1,
    first_record: int = 0,
) -> list[Path]:
    """The CF-named pair: ``[ocean/ice file, atmosphere file]``."""
    lat, lon, ocean, series = _series(ni, nj, seed, records, first_record)
    paths = {"ocean": Path(ocean_path), "atmosphere": Path(atmosphere_path)}
    for part, path in paths.items():

        def write(ds: netCDF4.Dataset, part: str = part) -> None:
            ds.title = f"synthetic {part} fields on a regular grid (ufsemulator)"
            ds.source = "ufsemulator.data.synthfiles.write_cf_pair"
            ds.Conventions = "CF-1.8"
            ds.createDimension("lat", nj)
            ds.createDimension("lon", ni)
            _time_axis(ds, "cf", records, first_record)
            for name, values, units in (
                ("lat", lat[:, 0], "degrees_north"),
                ("lon", lon[0, :], "degrees_east"),
            ):
                var = ds.createVariable(name, "f8", (name,))
                var.units, var.standard_name = units, ("latitude" if name == "lat" else "longitude")
                var[:] = values
            for key, (where, name, standard_name, units) in _CF_VARIABLES.items():
                if where != part:
                    continue
                # The ocean file leaves land out; the atmosphere covers the globe.
                fill = np.float32(9.96921e36) if part == "ocean" else None
                var = ds.createVariable(name, "f4", ("time", "lat", "lon"), fill_value=fill)
                var.standard_name, var.units = standard_name, units
                scale, offset = _TO_CF_UNITS.get(units, (1.0, 0.0))
                for r, fields in enumerate(series):
                    data = (fields[key] * scale + offset).astype(np.float32)
                    land = ~ocean if part == "ocean" else np.zeros_like(ocean)
                    var[r, :, :] = np.ma.masked_array(data, mask=land)

        _atomic(path, write)
    return [paths["ocean"], paths["atmosphere"]]


def _series(
    ni: int, nj: int, seed: int, records: int, first_record: int, days: float = 0.0
) -> tuple[FloatArray, FloatArray, npt.NDArray[np.bool_], Records]:
    """Records ``first_record ..``; ``days`` between records in the seasonal cycle (0:
    every record on 1 January)."""
    if ni < 4 or nj < 4:
        raise ValueError(f"grid must be at least 4 x 4, got ni={ni}, nj={nj}")
    lat, lon, ocean = synthetic_grid(ni, nj, seed)
    series: Records = []
    for g in range(first_record, first_record + records):
        day = DAY_OF_YEAR + g * days
        series.append(synthetic_fields(ni, nj, seed + _SEED_STRIDE * g, day)[0])
    return lat, lon, ocean, series


def _u_grid(
    lat: FloatArray, lon: FloatArray, ocean: npt.NDArray[np.bool_]
) -> tuple[FloatArray, FloatArray, npt.NDArray[np.bool_]]:
    """U points at the north-east corner of each T cell; ``umask`` is the minimum of the
    four T cells around it, so it drops coastal T cells (the top row: none to the north)."""
    dlat = lat[1, 0] - lat[0, 0]
    dlon = lon[0, 1] - lon[0, 0]
    east = np.roll(ocean, -1, axis=1)
    north = np.vstack([ocean[1:], np.zeros_like(ocean[:1])])
    north_east = np.roll(north, -1, axis=1)
    return lat + 0.5 * dlat, (lon + 0.5 * dlon) % 360.0, ocean & east & north & north_east


def _time_axis(ds: netCDF4.Dataset, layout: str, records: int, first_record: int) -> None:
    step = LAYOUTS[layout][1]
    ds.createDimension("time", None)
    ds.createDimension("d2", 2)
    time = ds.createVariable("time", "f8", ("time",))
    time.long_name = "model time"
    time.units = "days since 0001-01-01 00:00:00"
    time.calendar = "noleap"
    time.bounds = "time_bounds"
    bounds = ds.createVariable("time_bounds", "f8", ("time", "d2"))
    bounds.long_name = "boundaries for time-averaging interval"
    start = 1999 * 365.0 + DAY_OF_YEAR  # 2000-01-01 in the noleap calendar
    for r in range(records):
        begin = start + (first_record + r) * step
        time[r] = begin + step
        bounds[r, :] = [begin, begin + step]


def _atomic(out: Path, write: Callable[[netCDF4.Dataset], None]) -> Path:
    import netCDF4  # heavy and optional: imported only where a file is written

    out.parent.mkdir(parents=True, exist_ok=True)
    # A unique sibling, not mkstemp: the file gets the umask's permissions (shared data).
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        try:
            ds = netCDF4.Dataset(tmp, "w", format="NETCDF4")
        except OSError as exc:
            raise DataError(f"cannot write netCDF file '{out}': {exc}") from exc
        with ds:
            write(ds)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out
