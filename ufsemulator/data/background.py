"""Writes that need not hold up the caller: the array cache of a read, for the next run.

A training job reads its files and then moves the rows to the device; writing the arrays
it read to the cache (``data.cache_dir``) on the way costs as long again as a third of the
read (0.8 GB/s: about 0.7 s for 6.4 million rows), and nothing in the job waits for the
file. So the job writes it in a thread (file writes and zip's CRC release the GIL), and the
interpreter waits for the thread at exit (not a daemon): the file is whole or absent, as
before. ``wait`` joins the writes started so far (tests; a caller about to read the file).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

_started: list[threading.Thread] = []
_lock = threading.Lock()


def start(name: str, write: Callable[[], None]) -> threading.Thread:
    """Run ``write`` in a thread of its own; an ``OSError`` becomes one warning line on
    stderr (a cache not written is not worth stopping a job for)."""

    def run() -> None:
        try:
            write()
        except OSError as exc:
            print(f"Warning: {name} not written: {exc}", file=sys.stderr, flush=True)

    thread = threading.Thread(target=run, name=name, daemon=False)
    with _lock:
        _started[:] = [t for t in _started if t.is_alive()]
        _started.append(thread)
    thread.start()
    return thread


def wait(timeout_s: float | None = None) -> bool:
    """Join the writes started so far; whether all have ended (within ``timeout_s``)."""
    with _lock:
        threads = list(_started)
    for thread in threads:
        thread.join(timeout_s)
    return not any(thread.is_alive() for thread in threads)
