"""Keep freed memory in the process while a series is read (glibc only; elsewhere nothing).

Every field of every record is read into a fresh 6 MB array (a quarter-degree grid) and
dropped a moment later. glibc hands such blocks back to the kernel as soon as the free
space at the top of the heap passes its trim threshold, so the next read takes page faults
again: 72 thousand faults (280 MB zeroed by the kernel) to read 8 daily files, against
51 thousand with the heap kept, and page faults are what concurrent readers on one host
contend for. The freed memory goes back to the kernel when reading ends.

glibc raises both thresholds by itself as a process frees large blocks, up to 32 MB (mmap)
and 64 MB (trim); setting them switches that off, so after reading they stay where glibc's
own rule would have taken them: a training step's buffers are not handed back and faulted
in again at every step.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
from collections.abc import Iterator

# mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_KEEP = 1 << 30  # free space the heap keeps while reading
# Blocks below this come from the heap, not from mmap (glibc's largest dynamic threshold):
# a 6 MB field is then reused, not mapped and unmapped for every read.
_MMAP_BELOW = 32 * 1024 * 1024
_TRIM_AFTER = 2 * _MMAP_BELOW  # glibc's dynamic rule: twice the mmap threshold


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


@contextlib.contextmanager
def heap_kept() -> Iterator[None]:
    """While the block runs, freed memory stays in the heap; after it, it is trimmed."""
    libc = _libc()
    if libc is None:
        yield
        return
    libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_BELOW)
    libc.mallopt(_M_TRIM_THRESHOLD, _KEEP)
    try:
        yield
    finally:
        libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_AFTER)
        libc.malloc_trim(0)
