"""The array cache's files: kept where only you can write, used only as you wrote them.

A cache decides what a model learns from. One in a folder that others can write could be
replaced or planted (its name is derived from things anyone can read); one whose bytes were
changed since would train the model on them. So the cache is used only in a folder of the
user's alone (checked from the home folder down, or the folder itself outside it), its file
is opened once and must be the user's and writable by nobody else, and the SHA-256 of its
bytes must be the one recorded in the user's private state when it was written
(``~/.local/state/hpcdist/caches``). Anything else is not used (said in one line) and the
data are read from the files instead.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hpcdist.state import (
    DigestBook,
    Refused,
    folder_fd,
    make_state_base,
    read_at,
    sha256_bytes,
    write_at,
)

_MODE = 0o600


def _book() -> DigestBook:
    root = make_state_base()
    return DigestBook(root / "caches", root)


def folder_problem(folder: Path) -> str:
    """Why the cache cannot live in ``folder`` ("" if it can); a missing one is made 0700."""
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        with folder_fd(Path(os.path.abspath(folder)), what="array cache folder"):
            return ""
    except Refused as exc:
        return f"{str(exc.path)!r} {exc.problem}"
    except OSError as exc:
        return f"{str(folder)!r} cannot be made or opened ({exc.strerror})"


def _note(path: Path, why: str) -> None:
    print(f"Note: not using the array cache {path}: {why}; reading the data", file=sys.stderr)


def load_bytes(path: Path) -> bytes | None:
    """The cache file's bytes if it is this user's as written, else None (said why)."""
    path = Path(os.path.abspath(path))
    if not os.path.lexists(path):
        return None
    problem = folder_problem(path.parent)
    if problem:
        _note(path, problem)
        return None
    try:
        with folder_fd(path.parent, what="array cache folder") as fd:
            found = read_at(fd, path, "array cache")
    except (Refused, OSError) as exc:
        _note(path, str(exc))
        return None
    problem = _book().problem(path, found.sha256)
    if problem:
        _note(path, problem)
        return None
    return found.data


def save_bytes(path: Path, data: bytes) -> bool:
    """Write the cache file (0600, atomically, through its checked folder) and record its
    digest; False (said why) where the folder is not the user's alone."""
    path = Path(os.path.abspath(path))
    problem = folder_problem(path.parent)
    if problem:
        print(f"Note: not writing the array cache in {problem}", file=sys.stderr)
        return False
    digest = sha256_bytes(data)
    book = _book()
    with folder_fd(path.parent, what="array cache folder") as fd:
        book.expect(path, digest)
        write_at(fd, path.name, data, _MODE)
        book.settle(path, digest)
    return True
