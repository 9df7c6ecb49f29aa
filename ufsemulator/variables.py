"""The emulator's variables: names, units and their spellings in CICE, CF and JEDI.

No netCDF4 and no torch here: the model, the config and the export import these tables
without pulling in the file reader.

- ``INPUT_NAMES``: the 14 inputs in the design's order (``data.inputs`` picks a subset).
- ``CICE_NAMES``: the field name in a CICE history file, before the stream suffix.
- ``CF_NAMES``: CF standard names (and JEDI's names) a CF-named file may use, by input.
- ``JEDI_NAMES``: the name a JEDI background gives the field; what SABER looks up.
- ``SOCA_NAMES``: the names of the fields a SOCA (MOM6 + CICE) background holds, as its
  ``fields_metadata.yml`` spells them (JCSDA/soca ``test/Data/fields_metadata.yml``).
- ``UNITS``: the units the emulator is trained in (CICE's). The unit each exported name
  carries: :mod:`ufsemulator.export.names`.
"""

from __future__ import annotations

from typing import Any

INPUT_NAMES: tuple[str, ...] = (
    "sst",
    "sss",
    "tair",
    "tsfc",
    "hi",
    "hs",
    "sice",
    "uocn",
    "vocn",
    "uatm",
    "vatm",
    "qref",
    "flwdn",
    "fswdn",
)
TARGET_NAMES: tuple[str, ...] = ("aice", "sst", "tair")
MASK_MODES: tuple[str, ...] = ("sea_ice", "ocean", "both")

# A field written to several history streams gets one of these in every stream after the
# first ("" for the first, often the monthly one); "_h" is hourly/instantaneous.
CICE_SUFFIXES: tuple[str, ...] = ("_h", "_d", "", "_m", "_y", "_1")

CICE_NAMES: dict[str, str] = {
    "aice": "aice",
    "sst": "sst",
    "sss": "sss",
    "tair": "Tair",
    "tsfc": "Tsfc",
    "hi": "hi",
    "hs": "hs",
    "sice": "sice",
    "uocn": "uocn",
    "vocn": "vocn",
    "uatm": "uatm",
    "vatm": "vatm",
    "qref": "Qref",
    "flwdn": "flwdn",
    "fswdn": "fswdn",
}

# Other plain names seen in files written by other tools; tried after the CICE names.
OTHER_NAMES: dict[str, tuple[str, ...]] = {
    "aice": ("siconc",),
    "sst": ("SST",),
    "sss": ("SSS",),
    "tair": ("tair",),
    "tsfc": ("tsfc",),
    "qref": ("qref",),
    "flwdn": ("flw",),
    "fswdn": ("fsw",),
}

JEDI_NAMES: dict[str, str] = {
    "aice": "sea_ice_area_fraction",
    "sst": "sea_water_potential_temperature",
    "sss": "sea_water_salinity",
    "tair": "air_temperature",
    "tsfc": "snow_ice_surface_temperature",
    "hi": "sea_ice_volume",
    "hs": "sea_ice_snow_volume",
    "sice": "bulk_ice_salinity",
    "uocn": "eastward_sea_water_velocity",
    "vocn": "northward_sea_water_velocity",
    "uatm": "eastward_wind",
    "vatm": "northward_wind",
    "qref": "water_vapor_mixing_ratio_wrt_moist_air",
    "flwdn": "surface_downwelling_longwave_flux_in_air",
    "fswdn": "surface_downwelling_shortwave_flux_in_air",
}

# SOCA's own names (JCSDA/soca test/Data/fields_metadata.yml, commit 964fd66, October
# 2024): ocean fields from MOM6's restart, sea-ice and air fields from CICE's ("io file:
# ice", io names Tair_h, Tsfc_h, sice_h). SOCA keeps ice and snow thickness per category
# only (sea_ice_category_thickness, sea_ice_category_snow_thickness), not the cell means
# hi and hs, and no winds, humidity or radiation: those have no SOCA name.
SOCA_NAMES: dict[str, str] = {
    "aice": "sea_ice_area_fraction",
    "sst": "sea_water_potential_temperature",
    "sss": "sea_water_salinity",
    "tair": "air_temperature",
    "tsfc": "snow_ice_surface_temperature",
    "sice": "bulk_ice_salinity",
    "uocn": "eastward_sea_water_velocity",
    "vocn": "northward_sea_water_velocity",
}

# CF standard names first, then JEDI's where it differs; matched against a variable's
# name and its standard_name attribute.
CF_NAMES: dict[str, tuple[str, ...]] = {
    "aice": ("sea_ice_area_fraction",),
    "sst": (
        "sea_surface_temperature",
        "sea_water_potential_temperature",
        "sea_water_temperature",
        "skin_temperature_at_surface_where_sea",
    ),
    "sss": ("sea_surface_salinity", "sea_water_salinity"),
    "tair": ("air_temperature",),
    "tsfc": ("sea_ice_surface_temperature", "snow_ice_surface_temperature", "surface_temperature"),
    "hi": ("sea_ice_thickness", "sea_ice_volume"),
    "hs": ("surface_snow_thickness", "sea_ice_snow_thickness", "sea_ice_snow_volume"),
    "sice": ("sea_ice_salinity", "bulk_ice_salinity"),
    "uocn": (
        "sea_water_x_velocity",
        "eastward_sea_water_velocity",
        "surface_eastward_sea_water_velocity",
    ),
    "vocn": (
        "sea_water_y_velocity",
        "northward_sea_water_velocity",
        "surface_northward_sea_water_velocity",
    ),
    "uatm": ("eastward_wind", "x_wind"),
    "vatm": ("northward_wind", "y_wind"),
    "qref": ("specific_humidity", "water_vapor_mixing_ratio_wrt_moist_air"),
    "flwdn": ("surface_downwelling_longwave_flux_in_air",),
    "fswdn": ("surface_downwelling_shortwave_flux_in_air",),
}

UNITS: dict[str, str] = {
    "aice": "1",
    "sst": "degC",
    "sss": "ppt",
    "tair": "degC",
    "tsfc": "degC",
    "hi": "m",
    "hs": "m",
    "sice": "ppt",
    "uocn": "m/s",
    "vocn": "m/s",
    "uatm": "m/s",
    "vatm": "m/s",
    "qref": "g/kg",
    "flwdn": "W/m2",
    "fswdn": "W/m2",
}

# Physical bounds of an output, in UNITS (an export's optional clamp); others unbounded.
OUTPUT_BOUNDS: dict[str, tuple[float, float]] = {"aice": (0.0, 1.0)}

# Spellings of each unit, compared in lower case with blanks collapsed.
_ALIASES: dict[str, tuple[str, ...]] = {
    "degC": (
        "degc",
        "deg_c",
        "deg c",
        "c",
        "celsius",
        "degree_c",
        "degrees_c",
        "degree_celsius",
        "degrees_celsius",
        "degree celsius",
        "degrees celsius",
    ),
    "K": ("k", "kelvin", "degk", "deg_k", "degree_k", "degrees_k", "degree_kelvin"),
    "g/kg": ("g/kg", "g kg-1", "g kg^-1", "g.kg-1"),
    "kg/kg": ("kg/kg", "kg kg-1", "kg kg^-1", "kg.kg-1"),
    "ppt": ("ppt", "psu", "pss-78", "1e-3", "0.001", "practical_salinity_unit"),
    "m": ("m", "meter", "meters", "metre", "metres"),
    "m/s": ("m/s", "m s-1", "m s^-1", "m.s-1", "meter second-1"),
    "W/m2": ("w/m2", "w m-2", "w/m^2", "w m^-2", "w.m-2"),
    "1": ("1", "fraction", "0-1"),
    "%": ("%", "percent"),
}
_CANONICAL = {alias: unit for unit, aliases in _ALIASES.items() for alias in aliases}

# (from, to) -> (scale, offset): value_to = value_from * scale + offset. Salinity in g/kg
# is numerically ppt (the variable decides which of the two a "g/kg" means).
CONVERSIONS: dict[tuple[str, str], tuple[float, float]] = {
    ("K", "degC"): (1.0, -273.15),
    ("degC", "K"): (1.0, 273.15),
    ("kg/kg", "g/kg"): (1000.0, 0.0),
    ("g/kg", "kg/kg"): (1.0e-3, 0.0),
    ("g/kg", "ppt"): (1.0, 0.0),
    ("%", "1"): (0.01, 0.0),
    ("1", "%"): (100.0, 0.0),
}


def check_inputs(inputs: Any) -> tuple[str, ...]:
    """``inputs`` as a tuple of known, distinct input names (any order, at least one)."""
    names = (inputs,) if isinstance(inputs, str) else tuple(inputs)
    unknown = [name for name in names if name not in INPUT_NAMES]
    if not names or unknown:
        raise ValueError(
            f"inputs must be a non-empty list of {', '.join(INPUT_NAMES)}; got "
            f"{list(names)!r}" + (f" ({unknown[0]!r} is not one)" if unknown else "")
        )
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"inputs must not repeat a name, got {repeated[0]!r} twice")
    return names


def canonical_unit(text: str) -> str | None:
    """The table's spelling of ``text`` ("deg_C" -> "degC"), or None if unknown."""
    key = " ".join(text.strip().lower().split())
    return _CANONICAL.get(key)


def conversion(source: str, target: str) -> tuple[float, float] | None:
    """(scale, offset) taking values in unit ``source`` to ``target``; None if none is known.

    Both are spellings ``canonical_unit`` understands; equal units give (1, 0)."""
    src, dst = canonical_unit(source), canonical_unit(target)
    if src is None or dst is None:
        return None
    if src == dst:
        return (1.0, 0.0)
    return CONVERSIONS.get((src, dst))
