"""A data file read once, through one descriptor, and hashed while it is read.

A data file in a shared folder can be replaced, or rewritten, while a job reads it. Read by
name twice (once to parse, once to hash for the provenance), the model may learn from one
file while the provenance names another. So every byte is read once: the file is opened,
its descriptor checked (a regular file), its bytes read and hashed in the same pass, and
netCDF parses those very bytes from memory. The identity taken from the descriptor before
the read (device, inode, size, times) is compared after it: a file changed meanwhile is
refused in one line, never trained on.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from hpcdist.state import pause
from ufsemulator.errors import DataError

_CHUNK = 8 << 20
_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)

Identity = tuple[int, int, int, int, int]  # device, inode, size, mtime_ns, ctime_ns


def identity(info: os.stat_result) -> Identity:
    """What tells one state of a file from another: ``ctime`` cannot be set by anyone, so a
    file rewritten with its size and ``mtime`` put back still differs."""
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


@dataclass(frozen=True)
class FileBytes:
    """A data file's bytes as read, their SHA-256 (as ``sha256sum`` prints it) and the
    identity of the file they were read from."""

    path: Path
    data: bytes
    sha256: str
    identity: Identity


def read_file(path: Path) -> FileBytes:
    """``path`` read whole through one descriptor, hashed on the way; DataError (one line)
    for a file that cannot be read or that changed while it was read."""
    try:
        fd = os.open(path, _FLAGS)
    except OSError as exc:
        raise DataError(f"cannot read data file '{path}': {exc.strerror}") from exc
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            raise DataError(f"data file '{path}' is not a regular file")
        pause("data-read")  # tests: another user swaps the names here
        os.set_blocking(fd, True)
        digest, chunks = hashlib.sha256(), []
        while chunk := os.read(fd, _CHUNK):
            digest.update(chunk)
            chunks.append(chunk)
        after = os.fstat(fd)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if identity(after) != identity(before) or len(data) != before.st_size:
        raise DataError(
            f"data file '{path}' changed while it was read ({before.st_size} bytes, then "
            f"{after.st_size}; read {len(data)}): refusing to train on it"
        )
    return FileBytes(Path(path), data, digest.hexdigest(), identity(before))
