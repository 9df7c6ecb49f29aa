"""A season of daily CICE history files, written in parallel: a realistic training set.

``python -m ufsemulator make-data --grid 1440x1080 --days 30 --out DIR`` writes
``DIR/iceh.2000-01-01.nc`` ... (CICE's daily file names, so a glob sorts them in time
order), one record each, fields ``aice_d``, ``hi_d``, ... (the daily stream), day ``k``
``k`` days into the seasonal cycle from 1 January (``synthfiles`` with ``seasonal``).
One process per file, up to ``jobs`` at a time: each file is independent, and generating
the fields costs more than writing them.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import re
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

_GRID = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")
_FIRST_DAY = datetime.date(2000, 1, 1)  # the synthetic time axis starts on 2000-01-01


@dataclass(frozen=True)
class Written:
    """What ``write_days`` wrote, and how fast."""

    paths: tuple[Path, ...]
    bytes: int
    seconds: float
    jobs: int

    @property
    def mb_per_second(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


def parse_grid(text: str) -> tuple[int, int]:
    """``"1440x1080"`` -> (ni, nj); both at least 4."""
    match = _GRID.match(text)
    if match is None:
        raise ValueError(f"--grid must be NIxNJ like 1440x1080, got {text!r}")
    ni, nj = int(match.group(1)), int(match.group(2))
    if ni < 4 or nj < 4:
        raise ValueError(f"--grid must be at least 4x4, got {text!r}")
    return ni, nj


def day_paths(out_dir: Path, days: int) -> list[Path]:
    """``out_dir/iceh.YYYY-MM-DD.nc`` for ``days`` days from 2000-01-01 (noleap: the
    synthetic calendar has no 29 February, so neither do the names)."""
    paths: list[Path] = []
    date = _FIRST_DAY
    while len(paths) < days:
        if (date.month, date.day) != (2, 29):
            paths.append(out_dir / f"iceh.{date.isoformat()}.nc")
        date += datetime.timedelta(days=1)
    return paths


def write_days(
    out_dir: str | Path, ni: int, nj: int, days: int, seed: int = 0, jobs: int | None = None
) -> Written:
    """Write ``days`` daily files into ``out_dir`` with up to ``jobs`` processes (default:
    the CPUs this process may use)."""
    if days < 1:
        raise ValueError(f"--days must be >= 1, got {days}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = day_paths(out, days)
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    workers = max(1, min(days, jobs if jobs is not None else available))
    started = time.perf_counter()
    if workers == 1:
        for day, path in enumerate(paths):
            _write_day(path, ni, nj, seed, day)
    else:
        # fork: the workers start without importing anything again.
        context = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            futures = [
                pool.submit(_write_day, path, ni, nj, seed, day) for day, path in enumerate(paths)
            ]
            for future in futures:
                future.result()  # the first error, naming its file, is the one raised
    seconds = time.perf_counter() - started
    size = sum(path.stat().st_size for path in paths)
    return Written(paths=tuple(paths), bytes=size, seconds=seconds, jobs=workers)


def _write_day(path: Path, ni: int, nj: int, seed: int, day: int) -> Path:
    from ufsemulator.data.synthfiles import write_cice  # netCDF4 where a file is written

    return write_cice(path, ni, nj, seed, "_d", 1, day, "daily", seasonal=True)
