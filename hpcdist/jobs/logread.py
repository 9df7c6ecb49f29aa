"""Reading a job's log for a person: only a file the job wrote, shown with its control
characters escaped.

A log often sits in a folder that others can write. Another user may put a symbolic link
at its name (to a file of yours: `hpcdist logs` would print your secrets), or a file of
theirs full of terminal escape sequences (which rewrite what your terminal shows, or worse).
So a log is opened once without following a final symbolic link, and its descriptor must be
a regular file of yours with a single name; every control character but newline and tab is
printed as an escape (``\\x1b``), never sent to the terminal.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from hpcdist.errors import UserError
from hpcdist.state.private import user_name

_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class ForeignLog(UserError):
    """A log name that holds something the job did not write (a link, another's file)."""


def _refuse(path: Path, problem: str) -> ForeignLog:
    return ForeignLog(
        f"log {str(path)!r} {problem}: not a file the job wrote, not shown (another user "
        "may have put it there; remove it)"
    )


def log_problem(info: os.stat_result, my_uid: int) -> str:
    """Why an opened log is not the job's ("" if it is): pure, for the tests."""
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    if info.st_uid != my_uid:
        return f"is owned by {user_name(info.st_uid)} (uid {info.st_uid})"
    if info.st_nlink > 1:
        return f"has {info.st_nlink} names (a hard link to another file)"
    return ""


def read_log_bytes(path: Path, offset: int = 0) -> bytes:
    """The bytes of the log at ``path`` from ``offset``: b"" where there is no file;
    ForeignLog (one line) for a link or a file that is not the user's own."""
    try:
        fd = os.open(path, _FLAGS)
    except FileNotFoundError:
        return b""
    except OSError as exc:
        if os.path.islink(path):
            raise _refuse(path, "is a symbolic link") from exc
        raise
    try:
        problem = log_problem(os.fstat(fd), os.geteuid())
        if problem:
            raise _refuse(path, problem)
        os.set_blocking(fd, True)
        os.lseek(fd, offset, os.SEEK_SET)
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_log_text(path: Path) -> str:
    """The whole log as text (undecodable bytes replaced), control characters escaped."""
    return printable(read_log_bytes(path).decode(errors="replace"))


def one_line(text: str) -> str:
    """A value another user may have written (a job's name, comment, path, reason) for one
    line of output: every control character, newline and tab too, escaped as ``\\xNN``."""
    return _ANY_CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


_ANY_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with every control character except newline and tab escaped as ``\\xNN``."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
