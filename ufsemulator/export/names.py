"""The names an export may give its variables, and the unit each name carries.

SABER's TorchBalance looks every input up by name among the background's fields and never
reads a unit, so a name must fix its unit. One table says, for each of our variables,
which names it may be exported under and in which unit: our short name in the units we
train in (CICE's), CF standard names in their canonical units, JEDI's names as a JEDI
background holds them, and SOCA's as a SOCA background holds them. SOCA's units follow
from its ``fields_metadata.yml`` (JCSDA/soca ``test/Data/fields_metadata.yml``, commit
964fd66): each field is read from MOM6's or CICE's restart without conversion (the
identity case of ``src/soca/VariableChange/Model2GeoVaLs/Model2GeoVaLs.F90``), so
``sea_water_potential_temperature`` and its surface ``sea_surface_temperature`` are MOM6's
degC, ``air_temperature`` (CICE's ``Tair_h``) and ``snow_ice_surface_temperature``
(``Tsfc_h``) are CICE's degC, ``bulk_ice_salinity`` (``sice_h``) ppt; SOCA's only K
temperature is ``skin_temperature_at_surface_where_sea`` (the file adds 273.15). An
fv3-jedi background holds ``air_temperature`` in K: that one name has two units, so
``names: soca`` gives it in degC and ``names: jedi`` (or a mapping) in K. An export takes
the unit of the name it gives; a ``units`` setting can only confirm it, never pick another.

No torch here: the config check before training uses it too.
"""

from __future__ import annotations

from collections.abc import Mapping

from ufsemulator.variables import (
    CF_NAMES,
    JEDI_NAMES,
    SOCA_NAMES,
    UNITS,
    canonical_unit,
    conversion,
)

# A name's unit where it is not the one we train in. Names absent here carry UNITS.
_NAME_UNIT: dict[str, str] = {
    "sea_water_temperature": "K",
    "skin_temperature_at_surface_where_sea": "K",
    "air_temperature": "K",
    "sea_ice_surface_temperature": "K",
    "surface_temperature": "K",
    "specific_humidity": "kg/kg",
    "water_vapor_mixing_ratio_wrt_moist_air": "kg/kg",
}
# Inputs a SOCA (ocean) background holds at its surface, by their SOCA names: a row whose
# ocean inputs all hold export.land_value is land.
OCEAN_INPUTS: tuple[str, ...] = ("sst", "sss", "uocn", "vocn")
# Where a SOCA background holds a name in another unit than the table's (CICE's Tair_h).
_SOCA_UNIT: dict[str, str] = {"air_temperature": "degC"}
SCHEMES: tuple[str, ...] = ("short", "jedi", "soca")


def name_units(variable: str, scheme: str | None = None) -> dict[str, str]:
    """Every name ``variable`` may be exported under, with the unit that name carries
    (in a SOCA background with ``scheme`` ``soca``)."""
    native = UNITS.get(variable, "")
    names = [variable, JEDI_NAMES.get(variable, variable), *CF_NAMES.get(variable, ())]
    units = {name: _NAME_UNIT.get(name, native) for name in names}
    if scheme == "soca":
        units.update({n: u for n, u in _SOCA_UNIT.items() if n in units})
    return units


def scheme_of(choice: str | Mapping[str, str]) -> str | None:
    """The naming scheme of an ``export.names`` setting (None for a mapping)."""
    return None if isinstance(choice, Mapping) else choice


def exported_names(
    names: tuple[str, ...], choice: str | Mapping[str, str], known: tuple[str, ...] = ()
) -> list[str]:
    """Names to put in an export: ``short`` (ours), ``jedi``, or a mapping from ours.

    A mapping must name every input and output (a half-renamed model would mix two
    naming schemes), and nothing else: a name it lists that is neither in ``names`` nor
    in ``known`` (the model's other names) is an error, so a typo does not go unnoticed.
    Each name must be one the table gives that variable (:func:`name_units`)."""
    if isinstance(choice, Mapping):
        unknown = [key for key in choice if key not in (*names, *known)]
        if unknown:
            raise ValueError(
                f"export name mapping names {unknown[0]!r}, which the model does not have; "
                f"its variables: {', '.join((*names, *known))}"
            )
        missing = [name for name in (*names, *known) if name not in choice]
        if missing:
            raise ValueError(
                f"export name mapping lacks {', '.join(map(repr, missing))}: give every "
                "input and output a name, or use names: short or jedi"
            )
        chosen = [str(choice[name]) for name in names]
    elif choice == "short":
        chosen = list(names)
    elif choice == "jedi":
        chosen = [JEDI_NAMES.get(name, name) for name in names]
    elif choice == "soca":
        absent = [name for name in names if name not in SOCA_NAMES]
        if absent:
            raise ValueError(
                f"export names soca: a SOCA background holds no field for "
                f"{', '.join(absent)} (SOCA names: {', '.join(sorted(SOCA_NAMES))}; ice and "
                "snow thickness only per category); leave them out of data.inputs"
            )
        chosen = [SOCA_NAMES[name] for name in names]
    else:
        raise ValueError(
            f"export names must be 'short', 'jedi', 'soca' or a mapping, got {choice!r}"
        )
    for variable, name in zip(names, chosen, strict=True):
        _check_known(variable, name)
    if isinstance(choice, Mapping):
        _check_one_scheme(choice)
    return chosen


def _check_one_scheme(choice: Mapping[str, str]) -> None:
    """A mapping gives every variable a long name or none: short and long names mixed
    would be half our scheme and half a background's, which no background holds."""
    short = sorted(key for key, name in choice.items() if key == name)
    if short and len(short) < len(choice):
        raise ValueError(
            f"export name mapping mixes our short names ({', '.join(short)}) with a "
            "background's names; name every variable as the background does"
        )


def _check_known(variable: str, name: str) -> None:
    allowed = name_units(variable)
    if name not in allowed:
        spelled = ", ".join(f"{n} ({u or 'no unit'})" for n, u in allowed.items())
        raise ValueError(
            f"export name {name!r} for {variable!r} is not in the names table, so its unit "
            f"is unknown; names for {variable}: {spelled}"
        )


def check_distinct(inputs: list[str], outputs: list[str]) -> None:
    """Exported names must be non-empty, unique, and no input named like an output:
    SABER would drop a column or fail at set-up."""
    for name in (*inputs, *outputs):
        if not name.strip():
            raise ValueError(f"export names must not be empty, got {name!r}")
    seen = sorted({name for name in inputs if inputs.count(name) > 1})
    if seen:
        raise ValueError(f"export names must be unique: {seen[0]!r} names two inputs")
    clash = [name for name in inputs if name in outputs]
    if clash:
        raise ValueError(
            f"export name {clash[0]!r} names an input and an output; SABER reads the output "
            "from the background by its name: leave that variable out of data.inputs or "
            "predict another data.target"
        )


def exported_units(
    variables: tuple[str, ...],
    exported: list[str],
    choice: str | Mapping[str, str] | None,
    scheme: str | None = None,
) -> list[str]:
    """The unit each exported name carries (from the table; in a SOCA background with
    ``scheme`` ``soca``). ``choice`` (``export.units``) may only confirm them: ``native``
    and ``jedi`` must give the same units, a mapping ``{variable: unit}`` the same unit for
    each variable it lists."""
    units = [name_units(v, scheme)[name] for v, name in zip(variables, exported, strict=True)]
    for variable, name, unit in zip(variables, exported, units, strict=True):
        if conversion(UNITS.get(variable, unit) or unit, unit) is None and unit:
            raise ValueError(
                f"export name {name!r} carries {unit}, which {variable} ({UNITS[variable]}) "
                "cannot be converted to"
            )
        wanted = _wanted(variable, choice)
        if wanted is not None and _same(wanted, unit) is False:
            raise ValueError(
                f"export.units gives {variable} in {wanted!r}, but its exported name {name!r} "
                f"carries {unit or 'no unit'}: names fix units; drop export.units or choose "
                "the name of that unit"
            )
    return units


def _wanted(variable: str, choice: str | Mapping[str, str] | None) -> str | None:
    if choice is None:
        return None
    if isinstance(choice, Mapping):
        return choice.get(variable)
    if choice == "native":
        return UNITS.get(variable, "")
    if choice == "jedi":
        return _NAME_UNIT.get(JEDI_NAMES.get(variable, variable), UNITS.get(variable, ""))
    raise ValueError(f"export units must be 'native', 'jedi' or a mapping, got {choice!r}")


def _same(a: str, b: str) -> bool:
    return (canonical_unit(a) or a.strip()) == (canonical_unit(b) or b.strip())


def check_unit_keys(choice: str | Mapping[str, str] | None, variables: tuple[str, ...]) -> None:
    """A units mapping may only name the model's variables."""
    if isinstance(choice, Mapping):
        unknown = [key for key in choice if key not in variables]
        if unknown:
            raise ValueError(
                f"export unit mapping names {unknown[0]!r}, which the model does not have; "
                f"its variables: {', '.join(variables)}"
            )
