"""Rank 0's checkpoint files, written by a background thread.

Serialisation and fsync of a checkpoint overlap the next epoch's steps instead of
stalling every rank at the epoch end. The files are the same as ``save_checkpoint``
writes them (temporary file, fsync, rename, fsync of the folder); ``wait`` returns once
they are on disk.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from hpcdist.digests import DigestBook, sha256_file
from ufsemulator.checkpoint import _fsync_dir, save_checkpoint


class CheckpointWriter:
    """One state at a time, in order. ``submit`` takes a snapshot (the live weights move
    on) and returns; ``wait`` (or ``close``) before anything needs the files."""

    def __init__(self, digests: DigestBook | None = None) -> None:
        self.digests = digests  # where each file's SHA-256 is recorded (None: nowhere)
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None

    def submit(self, state: dict[str, Any], paths: list[Path]) -> None:
        self.wait()
        frozen = snapshot(state)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self._pending = self._pool.submit(write_all, frozen, paths, self.digests)

    def wait(self, reraise: bool = True) -> None:
        """Block until the last state is on disk; its write error, if any, is raised here."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            pending.result()
        except Exception:
            if reraise:
                raise

    def close(self, reraise: bool = True) -> None:
        """``wait``, then end the thread (a later ``submit`` starts another)."""
        try:
            self.wait(reraise)
        finally:
            if self._pool is not None:
                self._pool.shutdown()
                self._pool = None


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


def write_all(state: dict[str, Any], paths: list[Path], digests: DigestBook | None = None) -> None:
    """The first file is serialised; the others become further names of it (same bytes,
    already on disk), atomically replaced like any checkpoint. A later replacement of the
    first file leaves them as they are. Where hard links fail, they are written too.
    With ``digests``, every file's SHA-256 is recorded there."""
    first = save_checkpoint(state, paths[0], digests)
    digest = sha256_file(first) if digests is not None and len(paths) > 1 else ""
    for path in paths[1:]:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.link")
        try:
            tmp.unlink(missing_ok=True)
            os.link(first, tmp)
            if digests is not None:
                digests.expect(path, digest)
            os.replace(tmp, path)
            if digests is not None:
                digests.settle(path, digest)
        except OSError:
            tmp.unlink(missing_ok=True)
            save_checkpoint(state, path, digests)
        else:
            _fsync_dir(path.parent)
