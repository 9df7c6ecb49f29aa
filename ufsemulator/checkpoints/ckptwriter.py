"""Rank 0's checkpoint files, written by a background thread.

Serialisation and fsync of a checkpoint overlap the next epochs' steps instead of
stalling every rank at the epoch end. ``submit`` never waits for a write in progress:
where a file's newer state arrives before its older one was started, only the newer one
is written (a disk slower than the epochs then keeps the latest state, not a queue of
old ones). The files are the same as ``save_checkpoint`` writes them (temporary file,
fsync, rename, fsync of the folder); ``wait`` returns once every state handed over is on
disk, which the loop does before it reports a stop and at its end.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hpcdist.state import DigestBook
from ufsemulator.checkpoints.checkpoint import (
    checkpoint_bytes,
    write_bytes,
)


class CheckpointWriter:
    """States in order, the newest per file. ``submit`` takes a snapshot (the live weights
    move on) and returns at once; ``wait`` (or ``close``) before anything needs the files."""

    def __init__(
        self,
        digests: DigestBook | None = None,
        anchor: Path | None = None,
        on_written: Callable[[dict[str, Any], float], None] | None = None,
        delay_s: float = 0.0,
    ) -> None:
        self.digests = digests  # where each file's SHA-256 is recorded (None: nowhere)
        self.anchor = anchor  # the working folder the run folder is reached from
        # Told of every state on disk with the seconds its write took (the checkpoint's
        # measured time); a test slows every write by ``delay_s``.
        self.on_written, self.delay_s = on_written, delay_s
        self.last_seconds: float | None = None  # what the last write took
        self._cond = threading.Condition()
        self._queue: list[tuple[dict[str, Any], list[Path]]] = []
        self._busy = False
        self._closing = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.superseded = 0  # files not written because a newer state came first
        # The last state on disk: the label it was handed over with, and when its write
        # ended, as time.time() and time.perf_counter() (the heartbeat reports them).
        self.last_written: tuple[Any, float, float] | None = None
        self._labels: dict[int, Any] = {}

    def submit(self, state: dict[str, Any], paths: list[Path], label: Any = None) -> None:
        frozen = snapshot(state)
        self._labels[id(frozen)] = label
        wanted = set(paths)
        with self._cond:
            kept: list[tuple[dict[str, Any], list[Path]]] = []
            for old, old_paths in self._queue:
                rest = [path for path in old_paths if path not in wanted]
                self.superseded += len(old_paths) - len(rest)
                if rest:
                    kept.append((old, rest))
                else:
                    self._labels.pop(id(old), None)
            self._queue = [*kept, (frozen, list(paths))]
            if self._thread is None:
                self._closing = False
                self._thread = threading.Thread(target=self._work, name="checkpoint", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return
                state, paths = self._queue.pop(0)
                self._busy = True
                began = time.monotonic()
            try:
                if self.delay_s > 0:
                    time.sleep(self.delay_s)
                write_all(state, paths, self.digests, self.anchor)
                label = self._labels.pop(id(state), None)
                self.last_written = (label, time.time(), time.perf_counter())
                self.last_seconds = time.monotonic() - began
                if self.on_written is not None:
                    self.on_written(state, self.last_seconds)
            except BaseException as exc:  # reported by wait(), in the training's thread
                with self._cond:
                    self._error = self._error or exc
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def wait(self, reraise: bool = True) -> None:
        """Block until every state handed over is on disk; the first write error since the
        last ``wait``, if any, is raised here."""
        with self._cond:
            while self._queue or self._busy:
                self._cond.wait()
            error, self._error = self._error, None
        if error is not None and reraise:
            raise error

    def close(self, reraise: bool = True) -> None:
        """``wait``, then end the thread (a later ``submit`` starts another)."""
        try:
            self.wait(reraise)
        finally:
            thread = self._thread
            if thread is not None:
                with self._cond:
                    self._closing = True
                    self._cond.notify_all()
                thread.join()
                self._thread = None


def snapshot(value: Any) -> Any:
    """A copy of a checkpoint state that in-place updates of the live one cannot reach
    (on the CPU, the state dict's tensors are the parameters themselves)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return type(value)((key, snapshot(item)) for key, item in value.items())
    if isinstance(value, list):
        return [snapshot(item) for item in value]
    if isinstance(value, tuple):
        return tuple(snapshot(item) for item in value)
    return value  # numbers and strings


def write_all(
    state: dict[str, Any],
    paths: list[Path],
    digests: DigestBook | None = None,
    anchor: Path | None = None,
) -> None:
    """The state is serialised once; the first file of a folder is written, the others
    there become further names of it (same bytes, already on disk), atomically replaced
    like any checkpoint, and written too where hard links fail. A later replacement of the
    first file leaves them as they are. With ``digests``, the SHA-256 of those bytes is
    recorded for every file. ``anchor``: see ``save_checkpoint``."""
    write_bytes(checkpoint_bytes(state), paths, digests, anchor)
