"""The training arrays of a synthetic grid, made in memory: no netCDF file is written.

Same fields (``synthetic_fields``) and same selection (``data.select_points``) as the reader
applied to the file ``make_synthetic`` would write, so a benchmark trains on what
``python -m ufsemulator train`` trains on. Made once per benchmark run by the launcher
and handed to the ranks as an ``.npz``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ufsemulator.data.read import INPUT_NAMES, VARIABLE_NAMES, DataOptions, select_points
from ufsemulator.data.synthetic import synthetic_fields


@dataclass(frozen=True)
class Grid:
    ni: int
    nj: int
    seed: int = 0
    mask: str = "sea_ice"
    target: str = "aice"

    @classmethod
    def parse(cls, text: str, mask: str = "sea_ice") -> Grid:
        """``"384x320"`` (ni x nj) -> Grid."""
        ni, sep, nj = text.lower().partition("x")
        if not (sep and ni.isdigit() and nj.isdigit()) or int(ni) < 4 or int(nj) < 4:
            raise ValueError(f"grid must be NIxNJ with both >= 4, e.g. 384x320, got {text!r}")
        return cls(int(ni), int(nj), mask=mask)

    @property
    def name(self) -> str:
        return f"{self.ni}x{self.nj}-{self.mask}-seed{self.seed}"


def make_arrays(grid: Grid) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """(inputs [N, 14], targets [N, 1]) in physical units, float32, as the reader returns them."""
    fields, _, _, ocean = synthetic_fields(grid.ni, grid.nj, grid.seed)
    stacked = np.stack([fields[VARIABLE_NAMES[name][0]] for name in INPUT_NAMES], axis=-1)
    aice = fields["aice_h"]
    target = aice if grid.target == "aice" else fields[VARIABLE_NAMES[grid.target][0]]
    valid = ocean & np.isfinite(stacked).all(axis=-1) & np.isfinite(target) & np.isfinite(aice)
    index = select_points(
        valid.ravel(), aice.ravel(), DataOptions(mask=grid.mask, target=grid.target)
    )
    inputs = stacked.reshape(-1, len(INPUT_NAMES))[index].astype(np.float32)
    targets = target.ravel()[index].astype(np.float32)[:, None]
    return inputs, targets


def cached_arrays(grid: Grid, folder: Path) -> Path:
    """``folder/<grid>.npz`` holding ``inputs`` and ``targets``; made if missing."""
    path = folder / f"{grid.name}.npz"
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        inputs, targets = make_arrays(grid)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, inputs=inputs, targets=targets)
        tmp.replace(path)
    return path


def load_arrays(path: Path) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    with np.load(path) as data:
        return data["inputs"], data["targets"]
