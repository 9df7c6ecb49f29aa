"""Run folders anywhere: walked from a root the user trusts, without following links.

A run folder may sit below the working folder, in the home folder or in a project folder.
Every folder from a root the user trusts down to it is opened one name at a time
(``openat`` with ``O_NOFOLLOW``) and checked by what was opened: each must be the user's
and writable by nobody else (``trustedfile.open_folder``). Another user can then neither
rename a folder on the way nor put a link in its place. The roots, whose own paths may hold
links and whose own mode is not checked (a project folder may be shared), are the working
folder, the home folder and the folders named in ``HPCDIST_RUN_ROOTS`` (separated by
``:``); the deepest one above the run folder is where its walk starts.

A run folder below none of them is walked from ``/``: every folder on the way must be
root's or the user's, and one that others can write needs the sticky bit (``/tmp``), as a
job's working folder's parents do; a link on the way is followed only where root or the
user owns it. A 2775 project folder or another user's folder on the way is refused in one
line that names it.

A run's files are known by the path this walk reaches (``walked_path``: the root resolved,
the names below it as walked), never by a path resolved through links another user made.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path

from hpcdist.state.trustedfile import Refused, describe, open_folder, stat_problem

RUN_ROOTS_VAR = "HPCDIST_RUN_ROOTS"
ABOVE_HINT = (
    "keep the run folder below folders only you (or root) can write, or name a folder whose "
    f"writers you trust in {RUN_ROOTS_VAR}"
)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
_MAX_LINKS = 40  # as the kernel's own limit on links in one lookup
_LINKISH = {errno.ELOOP, errno.ENOTDIR}  # what O_NOFOLLOW | O_DIRECTORY say of a link


def run_roots(extra: tuple[Path, ...] = (), environ: Mapping[str, str] | None = None) -> list[str]:
    """The roots a run folder may be walked from, each as given and resolved: the working
    folder, the home folder, ``HPCDIST_RUN_ROOTS`` and ``extra`` (a job's own working
    folder, as its record says)."""
    env = os.environ if environ is None else environ
    named = [Path(p) for p in env.get(RUN_ROOTS_VAR, "").split(":") if p.strip()]
    found: list[str] = []
    for root in (Path.cwd(), Path.home(), *named, *extra):
        for form in (os.path.abspath(root), os.path.realpath(root)):
            if form not in found:
                found.append(form)
    return found


def start_of(path: Path, extra: tuple[Path, ...] = ()) -> str | None:
    """The deepest root at or above ``path``; None where it is below none."""
    path_s = os.path.abspath(path)
    above = [r for r in run_roots(extra) if path_s == r or path_s.startswith(r.rstrip("/") + "/")]
    return max(above, key=len) if above else None


def walked_path(path: Path, extra: tuple[Path, ...] = ()) -> Path:
    """``path`` as the walk reaches it: its root resolved, the names below it as they are
    (the walk follows no link there); below no root, the path with root's and the user's
    own links resolved (the only ones the walk follows)."""
    path_s = os.path.abspath(path)
    root = start_of(Path(path_s), extra)
    if root is None:
        return Path(os.path.realpath(path_s))
    below = path_s[len(root) :].lstrip("/")
    return Path(os.path.realpath(root), below) if below else Path(os.path.realpath(root))


def open_run_folder(folder: Path, what: str = "run folder", extra: tuple[Path, ...] = ()) -> int:
    """A descriptor of ``folder`` reached as the module docstring says; Refused (with the
    first folder that cannot be trusted, its owner and mode) otherwise. The caller closes
    it."""
    folder_s = os.path.abspath(folder)
    root = start_of(Path(folder_s), extra)
    if root is not None:
        return open_folder(Path(folder_s), Path(root), what, check_root=False)
    return _open_from_top(folder_s, what)


@contextlib.contextmanager
def run_folder_fd(
    folder: Path, what: str = "run folder", extra: tuple[Path, ...] = ()
) -> Iterator[int]:
    fd = open_run_folder(folder, what, extra)
    try:
        yield fd
    finally:
        os.close(fd)


def above_problem(info: os.stat_result, me: int) -> str:
    """Why a folder above a run folder, below no root, lets another user change what is
    below it; "" if it does not. Pure: the tests give it numbers."""
    if info.st_uid not in (me, 0):
        return f"is owned by another user, {describe(info.st_uid, info.st_mode)}"
    mode = info.st_mode
    if mode & (stat.S_IWGRP | stat.S_IWOTH) and not mode & stat.S_ISVTX:
        return f"can be written by others, {describe(info.st_uid, mode)}"
    return ""


def _open_from_top(folder: str, what: str) -> int:
    names = [n for n in folder.split("/") if n]
    fd, current, links = os.open("/", os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC), "/", 0
    try:
        _check(fd, current, what, last=not names)
        while names:
            name = names.pop(0)
            path = os.path.join(current, name)
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                target = _trusted_link(name, fd, path, what) if exc.errno in _LINKISH else None
                if target is None or links >= _MAX_LINKS:
                    raise
                links += 1
                joined = os.path.normpath(os.path.join(current, target))
                names = [n for n in joined.split("/") if n] + names
                os.close(fd)
                fd, current = os.open("/", os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC), "/"
                continue
            os.close(fd)
            fd, current = child, path
            _check(fd, current, what, last=not names)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _trusted_link(name: str, dir_fd: int, path: str, what: str) -> str | None:
    """The target of the link ``name`` if root or the user owns it; Refused if another
    user does; None where ``name`` is no link."""
    try:
        info = os.lstat(name, dir_fd=dir_fd)
    except OSError:
        return None
    if not stat.S_ISLNK(info.st_mode):
        return None
    if info.st_uid not in (os.geteuid(), 0):
        problem = f"is a symbolic link of another user, {describe(info.st_uid, info.st_mode)}"
        raise Refused(Path(path), what, problem, ABOVE_HINT)
    return os.readlink(name, dir_fd=dir_fd)


def _check(fd: int, path: str, what: str, last: bool) -> None:
    info = os.fstat(fd)
    if last:  # the run folder itself: the user's alone
        problem = stat_problem(info)
        if problem:
            problem = f"{problem}, {describe(info.st_uid, info.st_mode)}"
    else:
        problem = above_problem(info, os.geteuid())
        if problem:
            raise Refused(Path(path), what, problem, ABOVE_HINT)
    if problem:
        raise Refused(Path(path), what, problem)
