"""A run's output files: written so that nobody else can change them, read back only as
written.

A run folder may sit in a shared project folder, and a loose umask (002) would leave its
files group-writable: another user could rewrite ``model.pt`` or ``training_results.json``
in place. So every output is written atomically with no group or other write bit, whatever
the umask, and the SHA-256 of the very bytes written is recorded in the user's private state
(``hpcdist.state.digests``). A reader (export, ``hpcdist report``) opens the file once,
checks its owner and mode by the descriptor and its folders from a root the user trusts
down (``hpcdist.state.runroot``),
compares the digest of the bytes it read with the recorded one, and refuses a foreign or
changed file in one line.
"""

from __future__ import annotations

import os
from pathlib import Path

from hpcdist.state.digests import DigestBook, sha256_bytes
from hpcdist.state.fileutil import umask_mode
from hpcdist.state.folders import jobs_root
from hpcdist.state.private import PrivacyError
from hpcdist.state.runroot import run_folder_fd
from hpcdist.state.trustedfile import Refused, TrustedBytes, read_at, write_at


class OutputRefused(PrivacyError):
    """A run's file that is not as this user wrote it (one line, with the file's path)."""


def output_mode() -> int:
    """What the umask allows, never writable by group or others."""
    return umask_mode() & ~0o022


def book_for(folder: Path | None = None) -> DigestBook:
    """The digest book of the working folder ``folder`` (None: this one), as the training
    run there keeps it: ``$HPCDIST_HOME``'s if set, else that folder's private state."""
    chosen = os.environ.get("HPCDIST_HOME", "").strip()
    root = jobs_root(None if chosen or folder is None else Path(folder))
    return DigestBook(root / "digests", root)


def write_output(path: Path, data: bytes, book: DigestBook | None) -> str:
    """Write ``data`` as ``path`` (atomically, through its folder's descriptor, mode
    ``output_mode()``) and record its digest in ``book``; returns the digest."""
    path = Path(os.path.abspath(path))
    digest = sha256_bytes(data)
    with run_folder_fd(path.parent) as fd:
        if book is not None:
            book.expect(path, digest)
        write_at(fd, path.name, data, output_mode())
        if book is not None:
            book.settle(path, digest)
    return digest


def read_output(path: Path, book: DigestBook, what: str = "run file") -> TrustedBytes:
    """``path`` read once, if it is this user's, nobody else can write it or its folders,
    and its bytes have the digest ``book`` recorded; OutputRefused (one line) otherwise.
    FileNotFoundError where there is no such file."""
    path = Path(os.path.abspath(path))
    try:
        with run_folder_fd(path.parent) as fd:
            found = read_at(fd, path, what)
    except Refused as exc:
        where = "it" if exc.path == path else f"run folder {str(exc.path)!r}"
        hint = f"; {exc.hint}" if exc.hint else ""
        raise OutputRefused(f"refusing {what} {str(path)!r}: {where} {exc.problem}{hint}") from exc
    problem = book.problem(path, found.sha256)
    if problem:
        raise OutputRefused(f"refusing {what} {str(path)!r}: {problem}")
    return found
