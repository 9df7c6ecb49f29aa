"""The one ownership/mode check of hpcdist's private state, and the helpers built on it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hpcdist.state.fileutil import umask_mode, write_atomic
from hpcdist.state.private import (
    PrivacyError,
    check_private_chain,
    create_exclusive,
    ownership_problem,
    private_dir,
    write_private,
)
from hpcdist.state.trustedfile import read_private

ME = 1000
DIR, FILE, LINK = stat.S_IFDIR, stat.S_IFREG, stat.S_IFLNK


@pytest.mark.parametrize(
    ("uid", "mode", "problem"),
    [
        (ME, DIR | 0o700, ""),
        (ME, DIR | 0o755, ""),  # readable by others: not writable, accepted
        (ME, FILE | 0o600, ""),
        (ME, FILE | 0o644, ""),
        (ME, DIR | 0o770, "is writable by group (mode 0770)"),
        (ME, DIR | 0o702, "is writable by others (mode 0702)"),
        (ME, DIR | 0o1777, "is writable by group and others (mode 1777)"),
        (ME, FILE | 0o620, "is writable by group (mode 0620)"),
        (ME + 1, DIR | 0o700, "is owned by uid 1001"),
        (0, FILE | 0o600, "is owned by uid 0"),
        (ME, LINK | 0o777, "is a symbolic link"),
    ],
)
def test_ownership_problem(uid: int, mode: int, problem: str) -> None:
    found = ownership_problem(uid, mode, ME)
    assert found.startswith(problem) if problem else found == ""


def test_private_dir_is_created_0700_down_from_its_root(tmp_path: Path) -> None:
    root = tmp_path / ".hpcdist"
    made = private_dir(root / "a" / "b", root=root)
    for folder in (root, root / "a", made):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_own_readable_folder_is_narrowed_to_0700(tmp_path: Path) -> None:
    folder = tmp_path / "state"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    private_dir(folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777])
def test_writable_folder_is_refused_with_the_fix(tmp_path: Path, mode: int) -> None:
    folder = tmp_path / "state"
    folder.mkdir()
    folder.chmod(mode)
    with pytest.raises(PrivacyError, match=r"is writable by .*; run chmod go-w"):
        private_dir(folder / "jobs", root=folder)
    assert not (folder / "jobs").exists()


def test_symlinked_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "state").symlink_to(tmp_path / "real")
    with pytest.raises(PrivacyError, match="is a symbolic link; remove the link"):
        private_dir(tmp_path / "state")


def test_write_private_gives_0600_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o000)
    try:
        path = write_private(tmp_path / "s" / "f.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_create_exclusive_never_follows_a_link_nor_overwrites(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("precious\n")
    (tmp_path / "marker").symlink_to(target)
    with pytest.raises(PrivacyError, match="already exists as a symbolic link"):
        create_exclusive(tmp_path / "marker", "runs/1\n")
    with pytest.raises(PrivacyError, match="already exists as a file"):
        create_exclusive(target, "runs/1\n")
    assert target.read_text() == "precious\n"
    create_exclusive(tmp_path / "new", "runs/1\n")
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o600


def test_read_private_refuses_a_writable_file_and_a_link(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("x")
    path.chmod(0o600)
    assert read_private(path, "job secret") == "x"
    path.chmod(0o622)
    with pytest.raises(PrivacyError, match=r"job secret .* is writable by group and others"):
        read_private(path, "job secret")
    (tmp_path / "link").symlink_to(path)
    with pytest.raises(PrivacyError, match=r"job secret .*link' is a symbolic link"):
        read_private(tmp_path / "link", "job secret")


def test_check_private_chain_checks_existing_levels_only(tmp_path: Path) -> None:
    root = tmp_path / ".hpcdist"
    check_private_chain(root / "jobs" / "1.json", root, "job record")  # nothing exists: fine
    root.mkdir(mode=0o700)
    (root / "jobs").mkdir()
    (root / "jobs").chmod(0o777)
    with pytest.raises(PrivacyError, match="jobs' is writable by group and others"):
        check_private_chain(root / "jobs" / "1.json", root, "job record")


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_write_atomic_respects_the_umask(tmp_path: Path, umask: int, mode: int) -> None:
    old = os.umask(umask)
    try:
        assert umask_mode() == mode
        assert umask_mode(executable=True) == mode | (0o111 & ~umask)
        write_atomic(tmp_path / "out.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "out.txt").stat().st_mode) == mode


def test_replaceable_by_others_finds_a_writable_folder_above(tmp_path: Path) -> None:
    from hpcdist.state.private import replaceable_by_others

    shared = tmp_path / "proj"
    shared.mkdir()
    shared.chmod(0o700)
    assert replaceable_by_others(shared / ".hpcdist") is None
    shared.chmod(0o770)
    assert replaceable_by_others(shared / ".hpcdist") == shared
    shared.chmod(0o1777)  # sticky: others cannot rename what is ours
    assert replaceable_by_others(shared / ".hpcdist") is None
