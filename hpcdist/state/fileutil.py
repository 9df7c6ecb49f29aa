"""Small file helpers: atomic writes, so a crash never leaves half a file behind."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def current_umask() -> int:
    """The process umask (read by setting it: POSIX offers no other way)."""
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def umask_mode(executable: bool = False) -> int:
    """The mode ``open``/``creat`` would give a new file under the user's umask: temporary
    files are created 0600, so their final mode is set to this (or to a stricter one)."""
    return (0o777 if executable else 0o666) & ~current_umask()


def write_atomic(
    path: Path, text: str | bytes, mode: int | None = None, durable: bool = True
) -> None:
    """Write text (or bytes) to a temporary file beside ``path``, fsync it, then rename it
    into place.

    ``mode`` None: what the user's umask gives a new file (never a forced 0644).
    ``durable`` False: no fsync (still atomic for readers; for many small files that can
    be made again, such as the records of a sweep's tasks)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    final_mode = umask_mode() if mode is None else mode
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    data = text.encode("utf-8") if isinstance(text, str) else text
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.chmod(tmp, final_mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
