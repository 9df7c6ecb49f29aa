"""Trusted files: opened once, checked by what was opened, used from those very bytes.

A checkpoint, a profile, a job record or a secret decides what runs as the user. Checking
a path and then opening it again leaves a gap in which another user who can write a folder
above it swaps the names, and the second open reads their file. So, as OpenSSH
(``StrictModes``) and sudo do, every such file is opened once with ``O_NOFOLLOW``, its
descriptor is checked by ``fstat`` (a regular file, the user's own, not writable by group
or others), it is read, and whatever hashes, parses or loads it works on those bytes.

The folders above it are opened one name at a time from a trusted root (``openat`` with
``O_DIRECTORY | O_NOFOLLOW``), each checked by ``fstat`` as it is opened, so a rename of
a parent cannot redirect the walk: whatever is read comes from folders that were the
user's alone when they were opened. The root is the user's home folder for files below
it, else a folder given by the caller: the private state's own folder, or the working
folder (whose own mode is not checked: run outputs may live in a shared project folder;
their contents are vouched for by digests kept in the private state).

``HPCDIST_TEST_PAUSE`` (``LABEL:FOLDER``) is a test hook: at the moment named LABEL (after
a file was opened and checked, before it is used) the process creates
``FOLDER/LABEL.ready`` and waits up to 60 s for ``FOLDER/LABEL.go``, so a test can swap
names at exactly the moment a check-then-reopen design would have been exposed.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hpcdist.state.private import PrivacyError, ownership_problem, user_name

PAUSE_VAR = "HPCDIST_TEST_PAUSE"
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
# O_NONBLOCK: a FIFO put in a file's place must not hang the open; fstat refuses it.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
_LINKISH = {errno.ELOOP, errno.ENOTDIR}  # what O_NOFOLLOW / O_DIRECTORY say of a link


@dataclass(frozen=True)
class TrustedBytes:
    """A file's bytes as read from the one descriptor that was checked."""

    path: Path
    data: bytes
    uid: int
    mode: int

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def text(self) -> str:
        return self.data.decode("utf-8")


def pause(label: str) -> None:
    """The test hook of the module docstring; does nothing unless ``HPCDIST_TEST_PAUSE``
    names this label."""
    wanted, _, folder = os.environ.get(PAUSE_VAR, "").partition(":")
    if wanted != label or not folder:
        return
    Path(folder, f"{label}.ready").touch()
    deadline = time.monotonic() + 60
    while not Path(folder, f"{label}.go").exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def describe(uid: int, mode: int) -> str:
    """``owner NAME (uid N), mode 0755`` for one-line messages."""
    return f"owner {user_name(uid)} (uid {uid}), mode {stat.S_IMODE(mode):04o}"


def stat_problem(info: os.stat_result, allow_root_owner: bool = False) -> str:
    """Why an opened folder or file cannot be trusted (owner and mode); "" if it can."""
    me = os.geteuid()
    owner = me if allow_root_owner and info.st_uid == 0 else info.st_uid
    return ownership_problem(owner, info.st_mode, me)


def trusted_root(folder: Path) -> Path:
    """Where the walk to ``folder`` starts: the home folder for folders below it, else the
    folder itself (then it must be the user's own that no one else can write)."""
    folder = Path(os.path.abspath(folder))
    home = Path(os.path.abspath(Path.home()))
    return home if folder == home or home in folder.parents else folder


class Refused(PrivacyError):
    """A folder or file that cannot be trusted: ``path`` and ``problem`` (with its owner
    and mode) for callers that say it their own way."""

    def __init__(self, path: Path, what: str, problem: str, hint: str = "") -> None:
        from hpcdist.state.private import fix_hint

        self.hint = hint  # a fix of the caller's own; else the message says the usual one
        super().__init__(f"{what} {str(path)!r} {problem}; {hint or fix_hint(path, problem)}")
        self.path, self.problem = path, problem


def _refuse(path: Path, what: str, problem: str) -> Refused:
    return Refused(path, what, problem)


def open_folder(
    folder: Path,
    root: Path | None = None,
    what: str = "folder",
    check_root: bool = True,
    allow_root_owner: bool = False,
) -> int:
    """A descriptor of ``folder``, reached from ``root`` one name at a time (no symbolic
    links below ``root``); every folder opened below ``root`` (and ``root`` itself with
    ``check_root``) must be the user's and writable by nobody else. The caller closes it.
    Raises PrivacyError naming the first folder that is not, with its owner and mode."""
    # Plain strings, not Path objects, on the way down: a report of 10,000 results walks
    # 20,000 folders, and pathlib's parsing was a third of its time.
    folder_s = os.path.abspath(folder)
    root_s = str(trusted_root(Path(folder_s))) if root is None else os.path.abspath(root)
    below = folder_s[len(root_s) :] if root_s == "/" else folder_s[len(root_s) + 1 :]
    if folder_s != root_s and not folder_s.startswith(root_s.rstrip("/") + "/"):
        raise ValueError(f"{folder_s!r} is not below {root_s!r}")
    # The root is named by the user (home, the working folder): its own path may hold links.
    fd = os.open(root_s, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    current = root_s
    try:
        if check_root:
            _check_dir(fd, current, what, allow_root_owner)
        for name in below.split("/") if folder_s != root_s else ():
            current = os.path.join(current, name)
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in _LINKISH and _is_link(name, fd):
                    raise _refuse(Path(current), what, "is a symbolic link") from exc
                raise
            os.close(fd)
            fd = child
            _check_dir(fd, current, what, allow_root_owner)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _is_link(name: str, dir_fd: int | None) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


def _check_dir(fd: int, path: str, what: str, allow_root_owner: bool) -> None:
    info = os.fstat(fd)
    problem = stat_problem(info, allow_root_owner)
    if problem:
        raise _refuse(Path(path), what, f"{problem}, {describe(info.st_uid, info.st_mode)}")


@contextlib.contextmanager
def folder_fd(
    folder: Path,
    root: Path | None = None,
    what: str = "folder",
    check_root: bool = True,
    allow_root_owner: bool = False,
) -> Iterator[int]:
    fd = open_folder(folder, root, what, check_root, allow_root_owner)
    try:
        yield fd
    finally:
        os.close(fd)


def read_at(
    dir_fd: int | None,
    path: Path,
    what: str,
    allow_root_owner: bool = False,
    check_owner: bool = True,
    pause_label: str = "",
) -> TrustedBytes:
    """Open ``path`` (its name in ``dir_fd``, or the path itself without one) once with
    ``O_NOFOLLOW``, check the descriptor (a regular file; with ``check_owner`` the user's
    own, not writable by group or others) and read it whole."""
    path = Path(path)
    target = path.name if dir_fd is not None else str(path)
    try:
        fd = os.open(target, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in _LINKISH and _is_link(target, dir_fd):
            raise _refuse(path, what, "is a symbolic link") from exc
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _refuse(path, what, "is not a regular file")
        problem = stat_problem(info, allow_root_owner) if check_owner else ""
        if problem:
            raise _refuse(path, what, f"{problem}, {describe(info.st_uid, info.st_mode)}")
        if pause_label:
            pause(pause_label)
        os.set_blocking(fd, True)
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return TrustedBytes(path, b"".join(chunks), info.st_uid, info.st_mode)
    finally:
        os.close(fd)


def read_trusted(
    path: Path,
    what: str,
    root: Path | None = None,
    check_root: bool = True,
    allow_root_owner: bool = False,
    pause_label: str = "",
) -> TrustedBytes:
    """``read_at`` of ``path`` in its folder, reached and checked from ``root`` (see
    ``open_folder``; by default the home folder or the file's own folder)."""
    path = Path(os.path.abspath(path))
    with folder_fd(path.parent, root, what, check_root, allow_root_owner) as fd:
        return read_at(fd, path, what, allow_root_owner, pause_label=pause_label)


def read_once(path: Path) -> TrustedBytes:
    """A file the user named (``--resume FILE``): their word, so no owner check, but still
    one open (no symbolic link as its last name) and one read."""
    path = Path(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise IsADirectoryError(f"{str(path)!r} is not a regular file")
        os.set_blocking(fd, True)
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return TrustedBytes(path, b"".join(chunks), info.st_uid, info.st_mode)
    finally:
        os.close(fd)


def write_at(dir_fd: int, name: str, data: bytes, mode: int) -> None:
    """Write ``data`` as ``name`` in the folder ``dir_fd`` atomically: a new temporary file
    there (``O_EXCL | O_NOFOLLOW``), fsync, rename over ``name`` within the same folder
    descriptor, fsync of the folder. A rename of the folder meanwhile cannot move the write
    into another one."""
    tmp = f".{name}.{secrets.token_hex(6)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC
    fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    with contextlib.suppress(OSError):  # some file systems refuse to fsync a folder
        os.fsync(dir_fd)


def read_private(path: Path, what: str, root: Path | None = None) -> str:
    """The text of a file that must be this user's alone (a secret, a digest record): opened
    once, checked by its descriptor, its folders checked from ``root`` (default: the home
    folder for files below it, else the file's own folder); see ``read_trusted``."""
    return read_trusted(Path(path), what, root).text()
