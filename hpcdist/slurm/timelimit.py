"""SLURM's time-limit formats, parsed without a SLURM installation.

The grammar is sbatch's own (checked against ``sbatch --test-only`` on every SLURM version the
testbed runs): MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, where no field has an upper
bound (``00:60:00`` is an hour, ``1-24`` two days), and -1, INFINITE or UNLIMITED (any case),
or a total of zero, for no limit at all.
"""

from __future__ import annotations

import re

from hpcdist.errors import SpecError

# ASCII digits only, no spaces or signs: sbatch refuses other digits, and a padded value is
# not one word. The days part may stand alone ("1-") or have no number ("-5": 5 hours).
_WITH_DAYS = re.compile(r"([0-9]*)-(?:([0-9]+)(?::([0-9]+)(?::([0-9]+))?)?)?")
_WITHOUT_DAYS = re.compile(r"([0-9]+)(?::([0-9]+)(?::([0-9]+))?)?")
_UNLIMITED = ("-1", "INFINITE", "UNLIMITED")
# Python reads no number of more digits (and no time limit SLURM takes is near that long).
_TOO_LONG = re.compile(r"[0-9]{4001}")

_EXPECTED = "one of MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS"


def time_limit_seconds(value: str, where: str = "--time") -> int:
    """Seconds in a SLURM time limit such as ``"1-12:00:00"``; SpecError when malformed,
    and for a limit SLURM reads as none at all (hpcdist warns a job before its end, and
    cannot without one)."""
    seconds = parse_time_limit(value, where)
    if seconds is None:
        raise SpecError(
            f"{where} {value!r} asks SLURM for no time limit; hpcdist needs a finite time "
            "limit to warn the job before its end: expected e.g. 04:00:00 or 2-00:00:00"
        )
    return seconds


def parse_time_limit(value: str, where: str = "--time") -> int | None:
    """Seconds of a SLURM time limit, None for no limit; SpecError when sbatch refuses it."""
    if value.upper() in _UNLIMITED:
        return None
    if _TOO_LONG.search(value):
        raise SpecError(f"{where} {value!r} is not a SLURM time limit; expected {_EXPECTED}")
    days_match = _WITH_DAYS.fullmatch(value)
    if days_match is not None and value != "-":
        days, hours, minutes, seconds = (int(g or 0) for g in days_match.groups())
    else:
        match = _WITHOUT_DAYS.fullmatch(value)
        if match is None:
            raise SpecError(f"{where} {value!r} is not a SLURM time limit; expected {_EXPECTED}")
        fields = [int(g) for g in match.groups() if g is not None]
        # MM, MM:SS or HH:MM:SS
        hours, minutes, seconds = fields if len(fields) == 3 else [0, *fields, 0][:3]
        days = 0
    total = days * 86400 + hours * 3600 + minutes * 60 + seconds
    return total or None  # a limit of zero: no limit (sbatch(1))


def time_limit_minutes(value: str) -> int:
    """Whole minutes, rounded up, as submitit's local executor's ``timeout_min`` wants them."""
    return -(-time_limit_seconds(value) // 60)
