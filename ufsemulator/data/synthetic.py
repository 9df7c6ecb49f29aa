"""The fields of a synthetic CICE-style history file: the stand-in for real UFS output.

The fields are smooth random perturbations of simple climatologies for 1 January, coupled
the way the real ones are, so the reader and the emulator meet the same structure as in a
CICE history file:

- freezing point ``Tf = -0.054 * sss``; ``sst >= Tf``, approaching ``Tf`` where the ocean
  would be colder than freezing;
- ``aice`` is a smooth function of ``sst - Tf`` and ``tair`` plus small noise, clipped to
  [0, 1]; ``hi``, ``hs`` and ``sice`` are zero without ice (grid-cell means, as in CICE);
- ``Tsfc`` is the snow/ice surface temperature (<= 0) where there is ice and ``sst``
  over open water;
- ``fswdn`` is the daily-mean insolation, exactly zero in the polar night north of
  ``90 - |declination|`` (about 67N on 1 January); ``flwdn`` and ``Qref`` follow ``tair``.

The grid is a regular latitude-longitude grid from 80S to 90N (the latitude range of
the UFS tripolar grid) with a smooth random land mask, land south of about 72S, and an
open central Arctic. Land points hold ``_FillValue``. ``ufsemulator.data.synthfiles`` writes
the fields in each file layout the reader understands (CICE streams, the CF-named pair).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

FILL_VALUE = np.float32(1.0e30)  # CICE's history fill value
DAY_OF_YEAR = 0  # 1 January
SOLAR_CONSTANT = 1361.0  # W/m2
EARTH_RADIUS = 6.371e6  # m

# name -> (long_name, units, standard_name); the long names follow CICE's history output.
VARIABLES: dict[str, tuple[str, str, str | None]] = {
    "aice_h": ("ice area  (aggregate)", "1", "sea_ice_area_fraction"),
    "hi_h": ("grid cell mean ice thickness", "m", "sea_ice_thickness"),
    "hs_h": ("grid cell mean snow thickness", "m", "surface_snow_thickness"),
    "Tsfc_h": ("snow/ice surface temperature", "degC", "sea_ice_surface_temperature"),
    "sst_h": ("sea surface temperature", "degC", "sea_surface_temperature"),
    "sss_h": ("sea surface salinity", "ppt", "sea_surface_salinity"),
    "sice_h": ("bulk ice salinity", "ppt", "sea_ice_salinity"),
    "Tair_h": ("air temperature", "degC", "air_temperature"),
    "Qref_h": ("2m reference specific humidity", "g/kg", "specific_humidity"),
    "flwdn_h": ("down longwave flux", "W/m2", "surface_downwelling_longwave_flux_in_air"),
    "fswdn_h": ("down solar flux", "W/m2", "surface_downwelling_shortwave_flux_in_air"),
    "uocn_h": ("ocean current (x)", "m/s", "sea_water_x_velocity"),
    "vocn_h": ("ocean current (y)", "m/s", "sea_water_y_velocity"),
    "uatm_h": ("atm velocity (x)", "m/s", "eastward_wind"),
    "vatm_h": ("atm velocity (y)", "m/s", "northward_wind"),
}


def solar_declination(day_of_year: float = DAY_OF_YEAR) -> float:
    """Declination of the sun in degrees (a cosine fit, good to about a degree)."""
    return float(-23.44 * np.cos(2.0 * np.pi * (day_of_year + 10) / 365.0))


def daily_insolation(lat_deg: FloatArray, decl_deg: float) -> FloatArray:
    """Daily-mean top-of-atmosphere shortwave (W/m2); exactly zero in the polar night."""
    phi = np.deg2rad(lat_deg)
    delta = np.deg2rad(decl_deg)
    # Hour angle of sunset; 0 where the sun never rises, pi where it never sets.
    h0 = np.arccos(np.clip(-np.tan(phi) * np.tan(delta), -1.0, 1.0))
    q = (
        SOLAR_CONSTANT
        / np.pi
        * (h0 * np.sin(phi) * np.sin(delta) + np.cos(phi) * np.cos(delta) * np.sin(h0))
    )
    return np.where(h0 > 0.0, np.maximum(q, 0.0), 0.0)


def synthetic_grid(
    ni: int, nj: int, seed: int
) -> tuple[FloatArray, FloatArray, npt.NDArray[np.bool_]]:
    """lat, lon and ocean mask of ``synthetic_fields(ni, nj, seed)`` without its fields."""
    rng = np.random.default_rng(seed)
    lat, lon, xyz = _coordinates(ni, nj)
    return lat, lon, _ocean(rng, xyz, lat)


def _coordinates(ni: int, nj: int) -> tuple[FloatArray, FloatArray, FloatArray]:
    lat1 = -80.0 + (np.arange(nj) + 0.5) * 170.0 / nj
    lon1 = (np.arange(ni) + 0.5) * 360.0 / ni
    lon, lat = np.meshgrid(lon1, lat1)
    phi, lam = np.deg2rad(lat), np.deg2rad(lon)
    xyz = np.stack([np.cos(phi) * np.cos(lam), np.cos(phi) * np.sin(lam), np.sin(phi)], -1)
    return lat, lon, xyz


def _ocean(rng: np.random.Generator, xyz: FloatArray, lat: FloatArray) -> npt.NDArray[np.bool_]:
    # The first draws of ``rng``: the mask of a seed is the same whatever follows.
    land = _smooth_field(rng, xyz, 2.0) > 0.55
    land |= lat < -72.0 + 2.5 * _smooth_field(rng, xyz, 3.0)  # Antarctica
    land &= lat < 80.0  # open central Arctic
    return ~land


def synthetic_fields(
    ni: int, nj: int, seed: int, day_of_year: float = DAY_OF_YEAR
) -> tuple[dict[str, FloatArray], FloatArray, FloatArray, npt.NDArray[np.bool_]]:
    """The physical fields (by history name, land included), lat, lon and ocean mask.

    ``day_of_year`` (0: 1 January) sets the season: the sun's declination and how far the
    temperature climatologies have moved from January's (northern winter, southern summer)
    toward July's; day 0 gives exactly the January fields."""
    rng = np.random.default_rng(seed)
    lat, lon, xyz = _coordinates(ni, nj)

    def smooth(scale: float) -> FloatArray:
        return _smooth_field(rng, xyz, scale)

    ocean = _ocean(rng, xyz, lat)
    # Each stage draws from ``rng`` in turn: their order is the data of a seed.
    sss, tf, sst, tair = _surface(smooth, lat, day_of_year)
    ice = _ice(rng, smooth, north=lat >= 0.0, sst=sst, tf=tf, tair=tair)
    qref, flwdn, fswdn = _radiation(smooth, lat, tair, day_of_year)
    uatm, vatm, uocn, vocn = _winds(smooth, lat)
    fields = {
        "aice_h": ice["aice"],
        "hi_h": ice["hi"],
        "hs_h": ice["hs"],
        "Tsfc_h": ice["tsfc"],
        "sst_h": sst,
        "sss_h": sss,
        "sice_h": ice["sice"],
        "Tair_h": tair,
        "Qref_h": qref,
        "flwdn_h": flwdn,
        "fswdn_h": fswdn,
        "uocn_h": uocn,
        "vocn_h": vocn,
        "uatm_h": uatm,
        "vatm_h": vatm,
    }
    return fields, lat, lon, ocean


_Smooth = Callable[[float], FloatArray]  # a smooth random field of the given scale


def _climatologies(lat: FloatArray, day_of_year: float) -> tuple[FloatArray, ...]:
    """sst, tair and sss of the season, before the weather."""
    s = np.abs(np.sin(np.deg2rad(lat)))
    north = lat >= 0.0
    # winter: 1 in the north's January (day 0), 0 in its July; the south in antiphase.
    winter = 0.5 * (1.0 + np.cos(2.0 * np.pi * (day_of_year - DAY_OF_YEAR) / 365.0))
    sst_north = winter * (29.0 - 36.0 * s**2) + (1.0 - winter) * (29.0 - 31.0 * s**2)
    sst_south = winter * (29.0 - 33.0 * s**2) + (1.0 - winter) * (29.0 - 37.0 * s**2)
    tair_north = winter * (27.0 - 55.0 * s**3) + (1.0 - winter) * (27.0 - 28.0 * s**3)
    tair_south = winter * (27.0 - 35.0 * s**2.5) + (1.0 - winter) * (27.0 - 60.0 * s**2.5)
    sst_clim = np.where(north, sst_north, sst_south)
    tair_clim = np.where(north, tair_north, tair_south)
    sss_clim = 33.0 + 2.8 * np.exp(-(((np.abs(lat) - 25.0) / 18.0) ** 2))
    sss_clim -= 1.5 * np.clip((lat - 60.0) / 25.0, 0.0, 1.0)  # fresh Arctic surface
    return sst_clim, tair_clim, sss_clim


def _surface(smooth: _Smooth, lat: FloatArray, day_of_year: float) -> tuple[FloatArray, ...]:
    """sss, its freezing point tf, sst and tair: the climatologies plus weather."""
    sst_clim, tair_clim, sss_clim = _climatologies(lat, day_of_year)
    s = np.abs(np.sin(np.deg2rad(lat)))
    sss = np.clip(sss_clim + 0.5 * smooth(3.0), 30.0, 37.0)
    tf = -0.054 * sss
    sst_raw = sst_clim + 1.5 * smooth(2.5)
    # A smooth rectifier: sst stays above freezing and tends to it where sst_raw < Tf.
    sst = tf + 0.25 * np.logaddexp(0.0, (sst_raw - tf) / 0.25)
    tair = tair_clim + 2.5 * (0.5 + s) * smooth(3.0)
    return sss, tf, sst, tair


def _ice(
    rng: np.random.Generator,
    smooth: _Smooth,
    *,
    north: npt.NDArray[np.bool_],
    sst: FloatArray,
    tf: FloatArray,
    tair: FloatArray,
) -> dict[str, FloatArray]:
    """aice, hi, hs, sice and tsfc, where the ocean is near freezing and the air cold."""
    aice = 1.04 * _sigmoid((0.8 - (sst - tf)) / 0.25) * _sigmoid((-tair - 1.0) / 3.0) - 0.04
    aice += 0.015 * smooth(4.0) + 0.01 * rng.standard_normal(tair.shape)
    aice = np.clip(aice, 0.0, 1.0)
    ice = aice > 0.0

    # Thickness of the ice itself; the history fields are grid-cell means (times aice).
    h_ice = 0.2 + 0.3 * aice + 2.8 * np.where(north, 1.0, 0.4) * _sigmoid((-tair - 15.0) / 6.0)
    h_ice = np.maximum(h_ice + 0.1 * smooth(3.0), 0.05)
    h_snow = np.clip(0.05 + 0.1 * h_ice + 0.03 * smooth(3.0), 0.0, 0.6)
    hi = np.where(ice, aice * h_ice, 0.0)
    hs = np.where(ice, aice * h_snow, 0.0)
    sice = np.where(ice, np.clip(2.5 + 4.5 * np.exp(-h_ice / 0.8) + 0.3 * smooth(3.0), 1, 12), 0)
    # Snow and ice insulate: the surface sits between the air and the freezing ocean.
    t_ice = tair + (tf - tair) * 0.5 / (1.0 + 2.0 * h_ice + 6.0 * h_snow)
    tsfc = np.where(ice, np.minimum(t_ice, 0.0), sst)
    return {"aice": aice, "hi": hi, "hs": hs, "sice": sice, "tsfc": tsfc}


def _radiation(
    smooth: _Smooth, lat: FloatArray, tair: FloatArray, day_of_year: float
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """qref (g/kg), flwdn and fswdn (W/m2) under a random cloud cover."""
    rh = np.clip(0.8 + 0.05 * smooth(3.0), 0.6, 1.0)
    e_sat = 6.112 * np.exp(17.67 * tair / (tair + 243.5))  # hPa
    e = rh * e_sat
    qref = 1000.0 * 0.622 * e / (1013.25 - 0.378 * e)  # g/kg
    cloud = _sigmoid(1.5 * smooth(3.0) + 0.5)
    t_k = tair + 273.15
    emissivity = 1.24 * (e / t_k) ** (1.0 / 7.0)  # Brutsaert's clear sky
    emissivity = emissivity * (1.0 - cloud) + 0.98 * cloud
    flwdn = emissivity * 5.670374419e-8 * t_k**4
    fswdn = daily_insolation(lat, solar_declination(day_of_year)) * (0.75 - 0.45 * cloud)
    return qref, flwdn, fswdn


def _winds(smooth: _Smooth, lat: FloatArray) -> tuple[FloatArray, ...]:
    """uatm, vatm (trades, westerlies, polar easterlies) and the ocean's uocn, vocn."""
    u_clim = (
        -6.0 * np.exp(-((lat / 15.0) ** 2))
        + 10.0 * np.exp(-(((np.abs(lat) - 47.0) / 12.0) ** 2))
        - 3.0 * np.exp(-(((np.abs(lat) - 75.0) / 8.0) ** 2))
    )
    uatm = u_clim + 3.0 * smooth(3.0)
    vatm = 3.0 * smooth(3.0)
    uocn = 0.02 * uatm + 0.08 * smooth(4.0)
    vocn = 0.02 * vatm + 0.08 * smooth(4.0)
    return uatm, vatm, uocn, vocn


def _sigmoid(x: FloatArray) -> FloatArray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _smooth_field(rng: np.random.Generator, xyz: FloatArray, scale: float) -> FloatArray:
    """Zero-mean, unit-variance random field, smooth on the sphere (no seam at the pole)."""
    n_modes = 24
    waves = rng.normal(size=(n_modes, 3)) * scale
    phases = rng.uniform(0.0, 2.0 * np.pi, n_modes)
    amps = rng.normal(size=n_modes)
    field = np.zeros(xyz.shape[:-1])
    for k, phase, amp in zip(waves, phases, amps, strict=True):
        field += amp * np.cos(xyz @ k + phase)
    std = field.std()
    return (field - field.mean()) / (std if std > 0 else 1.0)
