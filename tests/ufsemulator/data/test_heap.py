"""Freed memory stays in the process while a series is read, and goes back after."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ufsemulator.data import heap

# A record's worth of quarter-degree arrays, twice: a few alive at once (a field, its
# float64 copy, the selection), all dropped at the end, as the reader does. Prints the
# page faults of the second record. A process of its own: glibc's thresholds are the
# process's, and a kept heap leaves them raised.
_RECORDS = """
import contextlib, resource, sys
import numpy as np
from ufsemulator.data.heap import heap_kept

def record():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    alive = [np.ones(1080 * 1440, dtype=np.float32) for _ in range(5)]
    del alive
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

with heap_kept() if sys.argv[1] == "kept" else contextlib.nullcontext():
    record()
    print(record())
"""
_FIELD_PAGES = 1080 * 1440 * 4 // 4096


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or heap._libc() is None, reason="glibc's malloc"
)
@pytest.mark.parametrize("kept", [True, False])
def test_a_kept_heap_reuses_the_records_memory(kept: bool) -> None:
    argv = [sys.executable, "-c", _RECORDS, "kept" if kept else "plain"]
    faults = int(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    if kept:
        assert faults < _FIELD_PAGES  # not even one field's pages faulted in again
    else:
        assert faults > _FIELD_PAGES  # glibc's own thresholds hand the memory back


def test_the_heap_is_given_back_after_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, int]] = []

    class Libc:
        def mallopt(self, param: int, value: int) -> int:
            calls.append(("mallopt", param))
            return 1

        def malloc_trim(self, pad: int) -> int:
            calls.append(("trim", pad))
            return 1

    monkeypatch.setattr(heap, "_libc", lambda: Libc())
    with pytest.raises(RuntimeError), heap.heap_kept():
        raise RuntimeError("a read failed")
    assert calls[-1] == ("trim", 0)
    monkeypatch.setattr(heap, "_libc", lambda: None)  # not glibc: nothing to do
    with heap.heap_kept():
        pass
