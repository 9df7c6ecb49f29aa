"""Which files and which records: ``data.path`` and ``data.time`` turned into plain lists.

No netCDF here, so a config can be checked (and a job rendered) without opening a file.

- ``data.path``: a file, a glob (``iceh.*.nc``; its matches sorted by name, which is time
  order for CICE's dated file names) or a list of them, in time order.
- ``data.time``: ``all``, one record ``INDEX`` or a range ``START:STOP`` (Python's slice
  rules: STOP excluded, either end may be left out, negative counts from the end),
  counted over the records of all files one after the other.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ufsemulator.errors import DataError

PathSpec = str | Path | Sequence[str | Path]

_GLOB_CHARS = re.compile(r"[*?\[]")
_RANGE = re.compile(r"^\s*(-?\d+)?\s*:\s*(-?\d+)?\s*$")


@dataclass(frozen=True)
class TimeSelection:
    """Records to read: all, one (``stop is None``) or ``start:stop``."""

    start: int | None = None
    stop: int | None = None
    single: bool = False
    text: str = "all"

    @property
    def everything(self) -> bool:
        """Every record: which records a file holds need not be known to select them."""
        return not self.single and self.start is None and self.stop is None

    def pick(self, n_records: int) -> list[int]:
        """The selected record numbers among ``n_records``; an error if there are none."""
        if self.single:
            assert self.start is not None
            if not -n_records <= self.start < n_records:
                raise DataError(
                    f"data.time {self.text} is out of range: the files hold {n_records} "
                    f"record{'s' if n_records != 1 else ''} (0..{n_records - 1})"
                )
            return [range(n_records)[self.start]]
        picked = list(range(n_records)[self.start : self.stop])
        if not picked:
            raise DataError(
                f"data.time {self.text!r} selects no record of the {n_records} in the files"
            )
        return picked


def parse_time(value: str | int) -> TimeSelection:
    """``"all"``, an integer (or its text) or ``"START:STOP"``; anything else is an error."""
    if isinstance(value, bool):
        raise ValueError(f"data.time must be all, INDEX or START:STOP, got {value!r}")
    if isinstance(value, int):
        return TimeSelection(start=value, single=True, text=str(value))
    text = str(value).strip()
    if text.lower() == "all":
        return TimeSelection()
    if re.fullmatch(r"-?\d+", text):
        return TimeSelection(start=int(text), single=True, text=text)
    match = _RANGE.match(text)
    if match is None:
        raise ValueError(f"data.time must be all, INDEX or START:STOP, got {value!r}")
    start, stop = (int(g) if g is not None else None for g in match.groups())
    return TimeSelection(start=start, stop=stop, text=text)


def data_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$HPCDIST_DATA_DIR``, else ``~/.cache/ufsemulator``: synthetic files and array caches."""
    env = os.environ if environ is None else environ
    configured = env.get("HPCDIST_DATA_DIR", "").strip()
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "ufsemulator"


def expand_paths(spec: PathSpec, what: str = "data file") -> list[Path]:
    """Files named by ``spec`` in the order given (a glob's matches sorted by name)."""
    entries = [spec] if isinstance(spec, (str, Path)) else list(spec)
    if not entries:
        raise DataError(f"no {what} given (an empty list)")
    files: list[Path] = []
    for entry in entries:
        text = str(Path(entry).expanduser()) if isinstance(entry, Path) else entry
        text = str(Path(text).expanduser()) if text.startswith("~") else text
        if _GLOB_CHARS.search(text) and not Path(text).exists():
            matches = sorted(glob.glob(text))
            if not matches:
                raise DataError(f"no {what} matches '{text}'")
            files.extend(Path(m) for m in matches)
            continue
        path = Path(text)
        if not path.is_file():
            raise DataError(f"{what} '{path}' does not exist")
        files.append(path)
    return files


def pair_groups(files: Sequence[Path], atmosphere: Sequence[Path] | None) -> list[tuple[Path, ...]]:
    """One group of files per stretch of time: each file alone, or with its atmosphere file."""
    if atmosphere is None:
        return [(path,) for path in files]
    if len(atmosphere) != len(files):
        raise DataError(
            f"{len(files)} ocean/ice file{'s' if len(files) != 1 else ''} but "
            f"{len(atmosphere)} atmosphere file{'s' if len(atmosphere) != 1 else ''}: they "
            "pair one to one, in time order"
        )
    return [(ocean, atm) for ocean, atm in zip(files, atmosphere, strict=True)]
