"""SLURM's time-limit formats, parsed without a SLURM installation."""

from __future__ import annotations

import re

from hpcdist.errors import SpecError

# The formats `sbatch --time` accepts (man sbatch), each with the fields it carries. ASCII
# digits only, no spaces: sbatch refuses other digits, and a padded value is not one word.
_FORMATS: tuple[tuple[re.Pattern[str], tuple[str, ...]], ...] = (
    (re.compile(r"([0-9]+)"), ("minutes",)),
    (re.compile(r"([0-9]+):([0-9]+)"), ("minutes", "seconds")),
    (re.compile(r"([0-9]+):([0-9]+):([0-9]+)"), ("hours", "minutes", "seconds")),
    (re.compile(r"([0-9]+)-([0-9]+)"), ("days", "hours")),
    (re.compile(r"([0-9]+)-([0-9]+):([0-9]+)"), ("days", "hours", "minutes")),
    (re.compile(r"([0-9]+)-([0-9]+):([0-9]+):([0-9]+)"), ("days", "hours", "minutes", "seconds")),
)

_EXPECTED = "one of MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS"


def time_limit_seconds(value: str) -> int:
    """Seconds in a SLURM time limit such as ``"1-12:00:00"``; SpecError when malformed."""
    for pattern, fields in _FORMATS:
        match = pattern.fullmatch(value)
        if match is None:
            continue
        parts = dict(zip(fields, (int(g) for g in match.groups()), strict=True))
        _check_field_ranges(value, parts, leading=fields[0])
        return (
            parts.get("days", 0) * 86400
            + parts.get("hours", 0) * 3600
            + parts.get("minutes", 0) * 60
            + parts.get("seconds", 0)
        )
    raise SpecError(f"--time {value!r} is not a SLURM time limit; expected {_EXPECTED}")


def _check_field_ranges(value: str, parts: dict[str, int], leading: str) -> None:
    # The leading field may overflow (90 minutes is fine); the fields after it may not.
    limits = {"hours": 24, "minutes": 60, "seconds": 60}
    for name, limit in limits.items():
        if name != leading and name in parts and parts[name] >= limit:
            raise SpecError(f"--time {value!r} has {name}={parts[name]}; expected < {limit}")
    if not any(parts.values()):
        raise SpecError(f"--time {value!r} is zero; expected a positive time limit")


def time_limit_minutes(value: str) -> int:
    """Whole minutes, rounded up, as submitit's local executor's ``timeout_min`` wants them."""
    return -(-time_limit_seconds(value) // 60)
