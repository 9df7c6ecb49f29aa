"""What SLURM's clients print, parsed: ``scontrol show job -o`` records, ``scontrol show
config`` settings, ``sacct -P`` tables, durations, memory sizes and exit codes. Pure: text
in, values out, no SLURM needed.
"""

from __future__ import annotations

import re
import time
from typing import Literal

from hpcdist.errors import UserError


class SlurmOutputError(UserError):
    """Text from a SLURM client that does not have the shape SLURM prints."""


# A key starts at the beginning of the line or after whitespace; '=' inside a value
# (TRES=cpu=4,node=2) follows no whitespace, so it never starts a key.
_KEY = re.compile(r"(?:(?<=\s)|^)([A-Za-z][A-Za-z0-9_/:]*)=")


def config_values(text: str) -> dict[str, str]:
    """``scontrol show config``: ``Name = value`` lines."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            out.setdefault(key.strip(), value.strip())
    return out


def parse_key_values(line: str) -> dict[str, str]:
    """One ``scontrol show job -o`` record: ``Key=value`` pairs separated by spaces.

    A value may hold spaces (a Command with arguments): a new pair starts only where
    whitespace is followed by a key and '='. An empty value (``Power=``) is kept as ''.
    """
    matches = list(_KEY.finditer(line))
    if not matches:
        raise SlurmOutputError(f"no Key=value pair in {line[:120]!r}; expected scontrol -o output")
    if line[: matches[0].start()].strip():
        raise SlurmOutputError(
            f"text before the first Key=value in {line[:120]!r}; expected scontrol -o output"
        )
    pairs: dict[str, str] = {}
    for match, following in zip(matches, [*matches[1:], None], strict=True):
        end = following.start() if following is not None else len(line)
        pairs[match.group(1)] = line[match.end() : end].rstrip()
    return pairs


def parse_scontrol_records(text: str) -> list[dict[str, str]]:
    """Every record of ``scontrol show job -o`` (one line each; an array job has several).
    Refused (SlurmOutputError) where they cannot be told apart: ``ambiguity``."""
    problem = ambiguity(text)
    if problem:
        raise SlurmOutputError(f"scontrol's job records cannot be told apart: {problem}")
    return [parse_key_values(line) for line in text.splitlines() if line.strip()]


# The start of a record of ``scontrol -o show job``: its numeric id, then another field.
_RECORD_START = re.compile(r"JobId=\d+ [A-Za-z]")
_USER_ID = re.compile(r"(?:^|\s)UserId=")


def ambiguity(text: str) -> str:
    """Why the records of ``scontrol -o show job`` output cannot be told apart (a job's
    name, comment, command or paths are its owner's text, printed unquoted, newlines and
    all, so one record can pose as several); "" if nothing says so: every line starts a
    record, names its owner once, and no job id or array task comes twice."""
    seen: set[str] = set()
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("No jobs in the system"):
            continue
        if not _RECORD_START.match(line):
            return f"line {number} starts no record (a field holds a newline)"
        if len(_USER_ID.findall(line)) != 1:
            return f"line {number} names an owner {len(_USER_ID.findall(line))} times"
        record = parse_key_values(line)
        keys = {record["JobId"]}
        if record.get("ArrayJobId") and record.get("ArrayTaskId", "").isdigit():
            keys.add(f"{record['ArrayJobId']}_{record['ArrayTaskId']}")
        if keys & seen:
            return f"line {number} repeats job {sorted(keys & seen)[0]}"
        seen |= keys
    return ""


def parse_sacct(text: str) -> list[dict[str, str]]:
    """The rows of ``sacct --parsable2`` output with its header line, as column -> value."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    header = lines[0].split("|")
    rows = []
    for line in lines[1:]:
        cells = line.split("|")
        if len(cells) != len(header):
            raise SlurmOutputError(
                f"sacct row {line[:120]!r} has {len(cells)} fields; expected {len(header)} "
                f"({'|'.join(header)})"
            )
        rows.append(dict(zip(header, cells, strict=True)))
    return rows


# Values SLURM prints where a time or size is not known or has no limit.
_NO_VALUE = frozenset(
    {"", "UNLIMITED", "INFINITE", "PARTITION_LIMIT", "INVALID", "N/A", "UNKNOWN", "NONE"}
)
_DURATION = re.compile(r"(?:(\d+)-)?((?:\d+:){0,2}\d+(?:\.\d+)?)")


def parse_duration(text: str) -> float | None:
    """Seconds in a duration as SLURM prints one: ``1-02:03:04``, ``02:03:04``, ``03:04``,
    ``03:04.512`` (TotalCPU), ``4``; None for ``UNLIMITED``, ``Partition_Limit`` or ''."""
    value = text.strip()
    if value.upper() in _NO_VALUE:
        return None
    match = _DURATION.fullmatch(value)
    if match is None:
        raise SlurmOutputError(f"duration {text!r}; expected [D-][HH:]MM:SS[.mmm]")
    days, clock = match.groups()
    if "." in clock.rpartition(":")[0]:
        raise SlurmOutputError(f"duration {text!r}; only the seconds may have a fraction")
    # Right to left: seconds, minutes, hours.
    fields = [float(part) for part in reversed(clock.split(":"))]
    return int(days or 0) * 86400 + sum(f * m for f, m in zip(fields, (1, 60, 3600), strict=False))


def parse_timestamp(text: str | None) -> float | None:
    """Seconds since the epoch of a SLURM timestamp (``2026-11-27T18:20:11``, local time);
    None for ``Unknown``, ``None``, ``(null)`` or ''."""
    try:
        return time.mktime(time.strptime((text or "").strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def format_duration(seconds: float | None) -> str:
    """``[D-]H:MM:SS`` for a number of seconds; ``unlimited`` for None."""
    if seconds is None:
        return "unlimited"
    whole = round(seconds)
    days, rest = divmod(whole, 86400)
    text = f"{rest // 3600}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


_MEMORY = re.compile(r"(\d+(?:\.\d+)?)([KMGTP]?)([nc]?)", re.IGNORECASE)
_UNIT_MB = {"K": 1.0 / 1024.0, "M": 1.0, "G": 1024.0, "T": 1024.0**2, "P": 1024.0**3}
MemoryPer = Literal["node", "cpu", "job"]
_PER: dict[str, MemoryPer] = {"n": "node", "c": "cpu", "": "job"}


def parse_memory_mb(text: str, bare_unit: str = "M") -> tuple[float, MemoryPer] | None:
    """(megabytes, per) for a SLURM size: ``4000M``, ``1.50G``, ``12345K`` (MaxRSS), and
    ReqMem as SLURM < 21.08 printed it, ``2000Mn`` (per node) or ``500Mc`` (per CPU).

    Without such a suffix ``per`` is "job" (ReqMem of SLURM >= 21.08 counts the whole job).
    A number without a unit is taken in ``bare_unit`` (MaxRSS '0'; --mem's MB). None for ''.
    """
    value = text.strip()
    if value.upper() in _NO_VALUE:
        return None
    match = _MEMORY.fullmatch(value)
    if match is None:
        raise SlurmOutputError(f"memory size {text!r}; expected e.g. 4000M, 1.5G or 2000Mn")
    number, unit, per = match.groups()
    scale = _UNIT_MB[(unit or bare_unit).upper()]
    return float(number) * scale, _PER[per.lower()]


def parse_exit_code(text: str) -> tuple[int, int]:
    """(exit code, signal) of SLURM's ``ExitCode=3:0``; a signal death reads ``0:9``."""
    code, sep, signal = text.strip().partition(":")
    if not code.isdigit() or (sep and not signal.isdigit()):
        raise SlurmOutputError(f"exit code {text!r}; expected CODE:SIGNAL such as 0:0 or 0:9")
    return int(code), int(signal or 0)


# States after which a job never runs again (sacct may add "by <uid>" to CANCELLED: see
# base_state).
FINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "OUT_OF_MEMORY",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
    }
)


def base_state(state: str) -> str:
    """``CANCELLED by 0`` -> ``CANCELLED``: sacct appends who cancelled a job."""
    words = state.split()
    return words[0].upper() if words else "UNKNOWN"


_TASK = re.compile(r"(?P<job>\d+)_(?P<task>\d+)")
_FOLDED = re.compile(r"(?P<job>\d+)_\[(?P<ranges>[0-9,\-]+)(%\d+)?\]")


def expand_task_ids(text: str) -> list[str]:
    """``123_4`` -> [123_4]; ``123_[5-7,9%2]`` -> [123_5, 123_6, 123_7, 123_9]; else []."""
    match = _TASK.fullmatch(text)
    if match:
        return [text]
    match = _FOLDED.fullmatch(text)
    if not match:
        return []
    out = []
    for part in match["ranges"].split(","):
        first, _, last = part.partition("-")
        if first.isdigit() and (not last or last.isdigit()):
            out += [f"{match['job']}_{i}" for i in range(int(first), int(last or first) + 1)]
    return out
