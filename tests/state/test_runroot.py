"""Run folders anywhere are walked from a root the user trusts, never through a link, and
known by the path that walk reaches.

``tmp_path`` is below neither the working folder (the repository) nor the home folder, so
a run folder there is walked from ``/`` unless the test names a root.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hpcdist.state.digests import DigestBook
from hpcdist.state.runroot import (
    RUN_ROOTS_VAR,
    above_problem,
    open_run_folder,
    start_of,
    walked_path,
)
from hpcdist.state.trustedfile import Refused

ME = os.geteuid()
OTHER = ME + 4242
DIR = stat.S_IFDIR


def _stat(uid: int, mode: int) -> os.stat_result:
    return os.stat_result((DIR | mode, 0, 0, 2, uid, 0, 0, 0, 0, 0))


@pytest.mark.parametrize(
    ("uid", "mode", "refused"),
    [
        (ME, 0o755, ""),
        (0, 0o755, ""),
        (0, 0o1777, ""),  # /tmp: others write, nobody renames another's name
        (ME, 0o2775, "can be written by others"),  # a group project folder
        (0, 0o777, "can be written by others"),
        (OTHER, 0o755, "is owned by another user"),
        (OTHER, 0o1777, "is owned by another user"),
    ],
)
def test_a_folder_above_a_run_folder_is_the_users_or_roots_and_nobody_elses_to_rename(
    uid: int, mode: int, refused: str
) -> None:
    problem = above_problem(_stat(uid, mode), ME)
    assert (problem.startswith(refused) and bool(problem)) if refused else problem == ""
    if refused:
        assert f"mode {mode:04o}" in problem


def _run(tmp_path: Path, shared_mode: int) -> Path:
    shared = tmp_path / "shared"
    run = shared / "exp" / "runs" / "final"
    run.mkdir(parents=True, mode=0o755)
    for folder in (run, run.parent, run.parent.parent):
        folder.chmod(0o755)
    shared.chmod(shared_mode)
    return run


def test_a_run_folder_below_a_folder_others_can_write_is_refused_unless_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp_path.chmod(0o755)
    run = _run(tmp_path, 0o2775)
    monkeypatch.delenv(RUN_ROOTS_VAR, raising=False)
    assert start_of(run) is None
    with pytest.raises(Refused) as refused:
        open_run_folder(run)
    assert refused.value.path == tmp_path / "shared" and "mode 2775" in str(refused.value)
    assert RUN_ROOTS_VAR in str(refused.value)
    (tmp_path / "shared").chmod(0o755)  # the other side: nobody else can rename in it
    os.close(open_run_folder(run))
    (tmp_path / "shared").chmod(0o2775)
    monkeypatch.setenv(RUN_ROOTS_VAR, f"/nonexistent:{tmp_path / 'shared'}")
    assert start_of(run) == str(tmp_path / "shared")
    os.close(open_run_folder(run))


def test_a_link_below_a_named_root_is_refused_and_the_digest_is_kept_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp_path.chmod(0o755)
    run_b = _run(tmp_path, 0o2775)
    shared = tmp_path / "shared"
    monkeypatch.setenv(RUN_ROOTS_VAR, str(shared))
    (shared / "expA").symlink_to(shared / "exp")
    run_a = shared / "expA" / "runs" / "final"
    with pytest.raises(Refused) as refused:
        open_run_folder(run_a)
    assert refused.value.path == shared / "expA" and refused.value.problem == "is a symbolic link"
    # The records of the two names are two: expA's never accepts the bytes of exp's.
    assert walked_path(run_a / "model.pt") == shared / "expA" / "runs" / "final" / "model.pt"
    assert walked_path(run_b / "model.pt") == run_b / "model.pt"
    book = DigestBook(tmp_path / "book", tmp_path / "book")
    book.settle(run_b / "model.pt", "b" * 64)
    assert book.problem(run_a / "model.pt", "b" * 64).startswith("no digest of it")
    assert book.problem(run_b / "model.pt", "b" * 64) == ""


def test_a_link_of_the_users_own_above_every_root_is_followed_and_walked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp_path.chmod(0o755)
    run = _run(tmp_path, 0o755)
    monkeypatch.delenv(RUN_ROOTS_VAR, raising=False)
    (tmp_path / "scratch").symlink_to(tmp_path / "shared")  # as /scratch -> /lustre/...
    via = tmp_path / "scratch" / "exp" / "runs" / "final"
    os.close(open_run_folder(via))
    assert walked_path(via) == run
    (tmp_path / "shared").chmod(0o777)  # the link's target is walked and checked too
    with pytest.raises(Refused) as refused:
        open_run_folder(via)
    assert refused.value.path == tmp_path / "shared"


@pytest.mark.skipif(ME != 0, reason="a link of another user needs root to make")
def test_a_link_of_another_user_above_every_root_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp_path.chmod(0o755)
    _run(tmp_path, 0o755)
    monkeypatch.delenv(RUN_ROOTS_VAR, raising=False)
    link = tmp_path / "scratch"
    link.symlink_to(tmp_path / "shared")
    os.lchown(link, 65534, 65534)
    with pytest.raises(Refused) as refused:
        open_run_folder(link / "exp" / "runs" / "final")
    assert refused.value.path == link and "symbolic link of another user" in str(refused.value)


def test_a_run_folder_two_missing_levels_deep_outside_the_working_folder_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ufsemulator.training.runfiles import run_dir_problem

    tmp_path.chmod(0o755)
    monkeypatch.delenv(RUN_ROOTS_VAR, raising=False)
    run = tmp_path / "a" / "b" / "c"  # HPCDIST_RUN_DIR=/.../a/b/c, a/ and b/ missing
    assert run_dir_problem(run) == ""
    assert [stat.S_IMODE(p.stat().st_mode) for p in (run, run.parent, run.parent.parent)] == [
        0o755
    ] * 3


def test_a_run_folder_holding_another_folders_heartbeat_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpcdist.distributed.heartbeat import heartbeat_for
    from ufsemulator.training.runfiles import run_dir_problem

    tmp_path.chmod(0o755)
    monkeypatch.delenv(RUN_ROOTS_VAR, raising=False)
    run_b = _run(tmp_path, 0o755)
    heartbeat_for(run_b, 3, 30, 0, {"HPCDIST_RUN_ID": "runB"}).beat(1, 8.0, epoch=1)
    assert run_dir_problem(run_b) == ""  # its own folder: written there
    run_a = tmp_path / "shared" / "expA" / "runs" / "final"
    os.rename(tmp_path / "shared" / "exp", tmp_path / "shared" / "expA")  # moved into A's name
    assert run_dir_problem(run_a) == (
        f"run folder '{run_a}' holds the files of run runB, written in '{run_b}' "
        "(moved or renamed into this name)"
    )
