"""Private state: folders and files that only their owner may write.

Job records, submitit's folders and the scripts it queued, requeue markers, per-job secrets and
checkpoint digests decide what runs as the user and what a job trusts. Another user who
can write any of them can run code as the user (a replaced pickle) or change the model
(a planted checkpoint). So they live in folders created 0700 and files created 0600, and
an existing one that belongs to someone else, or that the group or others may write, is
refused in one line that says how to fix it. ``ownership_problem`` is the one check, pure,
for every such path; the rest of the module applies it.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from hpcdist.errors import UserError
from hpcdist.state.fileutil import write_atomic

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


class PrivacyError(UserError):
    """A path that should be the user's alone belongs to, or is writable by, someone else."""


def ownership_problem(uid: int, mode: int, my_uid: int) -> str:
    """Why a path with this owner and ``st_mode`` cannot be trusted by ``my_uid``; "" if it
    can. Pure: the tests give it numbers."""
    if stat.S_ISLNK(mode):
        return "is a symbolic link"
    if uid != my_uid:
        return f"is owned by uid {uid} ({user_name(uid)}), not by you (uid {my_uid})"
    writable = [
        who for who, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if mode & bit
    ]
    if writable:
        return f"is writable by {' and '.join(writable)} (mode {stat.S_IMODE(mode):04o})"
    return ""


def path_problem(path: Path) -> str:
    """``ownership_problem`` of an existing path (not following a final symlink)."""
    info = os.lstat(path)
    return ownership_problem(info.st_uid, info.st_mode, os.geteuid())


def check_owned(path: Path, what: str) -> None:
    """Raise PrivacyError unless ``path`` is this user's and nobody else can write it."""
    problem = path_problem(path)
    if problem:
        raise PrivacyError(f"{what} {str(path)!r} {problem}; {fix_hint(path, problem)}")


def private_dir(
    path: Path, what: str = "hpcdist's private folder", root: Path | None = None
) -> Path:
    """``path`` as a folder of this user's alone: created 0700 (with any missing parents),
    or checked and, when it is the user's own and only readable by others, narrowed to
    0700. With ``root`` (an ancestor), every folder from ``root`` down is made so too."""
    path = Path(path)
    chain = [path]
    if root is not None:
        root = Path(root)
        chain = [root, *(p for p in reversed(path.parents) if root in p.parents), path]
        chain = [p for n, p in enumerate(chain) if p not in chain[:n]]
    for folder in chain:
        _one_private_dir(folder, what)
    return path


def check_private_chain(path: Path, root: Path, what: str) -> None:
    """Check, without creating anything, every existing folder from ``root`` down to
    ``path`` (a folder or a file): raise PrivacyError at the first that is not private."""
    path, root = Path(path), Path(root)
    chain = [root, *(p for p in reversed(path.parents) if root in p.parents)]
    if path != root:
        chain.append(path)
    for item in chain:
        if os.path.lexists(item):
            check_owned(item, what)


def replaceable_by_others(path: Path) -> Path | None:
    """The first folder above ``path`` that others may write without the sticky bit: there
    they can rename ``path`` away and put their own in its place, whatever its own mode."""
    for folder in Path(os.path.abspath(path)).parents:
        try:
            mode = os.lstat(folder).st_mode
        except OSError:
            return None
        if mode & (stat.S_IWGRP | stat.S_IWOTH) and not mode & stat.S_ISVTX:
            return folder
    return None


def _one_private_dir(path: Path, what: str) -> None:
    if not os.path.lexists(path):
        os.makedirs(path.parent, exist_ok=True)  # above the private part: the umask's modes
        with contextlib.suppress(FileExistsError):  # another process made it just now
            os.mkdir(path, PRIVATE_DIR_MODE)
    check_owned(path, what)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise PrivacyError(f"{what} {str(path)!r} is not a folder; remove it")
    if stat.S_IMODE(info.st_mode) != PRIVATE_DIR_MODE:
        os.chmod(path, PRIVATE_DIR_MODE)


def write_private(
    path: Path, text: str, what: str = "hpcdist's private folder", root: Path | None = None
) -> Path:
    """Write a 0600 file atomically into a private folder (checked or created)."""
    private_dir(path.parent, what, root)
    write_atomic(path, text, mode=PRIVATE_FILE_MODE)
    return path


def create_exclusive(path: Path, text: str) -> None:
    """Create a new 0600 file: never through a symbolic link, never over an existing file
    (``O_EXCL | O_NOFOLLOW``). Raises PrivacyError for a path that already exists."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, PRIVATE_FILE_MODE)
    except FileExistsError as exc:
        kind = "a symbolic link" if os.path.islink(path) else "a file"
        raise PrivacyError(
            f"{str(path)!r} already exists as {kind}, which hpcdist did not create; "
            "remove it and check who can write its folder"
        ) from exc
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


def fix_hint(path: Path, problem: str) -> str:
    """How to fix what ``ownership_problem`` found, in a few words."""
    if "writable" in problem:
        return f"run chmod go-w {str(path)!r} if its contents are yours, else remove it"
    if "symbolic link" in problem:
        return "remove the link"
    return (
        "remove it (its owner can), or set HPCDIST_HOME to a folder of yours so that "
        "hpcdist keeps its state there"
    )


def user_name(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return "unknown user"
