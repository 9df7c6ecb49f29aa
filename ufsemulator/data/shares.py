"""Which files each rank of a training reads: contiguous blocks, balanced by their bytes.

No netCDF here: a rank learns its files from their sizes (``os.stat``) alone, so it opens
only the files it reads. Opening every file of a series first, only to count its records,
cost each of 4 ranks as much as reading 1 of the 30 daily quarter-degree files.
"""

from __future__ import annotations

from collections.abc import Sequence

from ufsemulator.errors import DataError


def file_blocks(sizes: Sequence[int], world: int) -> list[tuple[int, int]]:
    """``[first, last)`` file numbers of each of ``world`` ranks: contiguous blocks in the
    order given, at least one file each, a file going to the rank in whose part of the
    total bytes its middle byte lies. Pure."""
    n = len(sizes)
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    if n < world:
        raise DataError(
            f"{n} file(s) cannot be shared by {world} ranks: give more files, or use fewer ranks"
        )
    weights = list(sizes) if sum(sizes) > 0 else [1] * n
    total = sum(weights)
    # Twice the byte offset of each file's middle, in integers: no rounding at a boundary.
    middles, before = [], 0
    for weight in weights:
        middles.append(2 * before + weight)
        before += weight
    starts = [0]
    for rank in range(1, world):
        start = sum(1 for middle in middles if middle * world < 2 * rank * total)
        start = max(start, starts[-1] + 1)  # every rank at least one file
        starts.append(min(start, n - (world - rank)))  # and one left for each after it
    return list(zip(starts, [*starts[1:], n], strict=True))
