"""Checkpoint digests in the private state: auto-resume accepts only what this user wrote."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

import pytest
import torch

from hpcdist.state.digests import DigestBook, sha256_file
from ufsemulator.checkpoints.checkpoint import save_checkpoint
from ufsemulator.checkpoints.ckptwriter import write_all


@pytest.fixture
def book(tmp_path: Path) -> DigestBook:
    return DigestBook(tmp_path / ".hpcdist" / "digests", tmp_path / ".hpcdist")


def test_sha256_file(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"abc" * 1_000_000)
    assert sha256_file(path) == hashlib.sha256(b"abc" * 1_000_000).hexdigest()


def test_saved_checkpoint_is_recorded_and_accepted(tmp_path: Path, book: DigestBook) -> None:
    path = save_checkpoint({"w": torch.ones(3)}, tmp_path / "run" / "checkpoint.pt", book)
    assert book.accepted(path) == [sha256_file(path)]
    assert book.problem(path, sha256_file(path)) == ""
    record = book.record_path(path)
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert stat.S_IMODE(record.parent.stat().st_mode) == 0o700


def test_changed_checkpoint_is_refused(tmp_path: Path, book: DigestBook) -> None:
    path = save_checkpoint({"w": torch.ones(3)}, tmp_path / "checkpoint.pt", book)
    torch.save({"w": torch.full((3,), 7.0)}, path)  # same name, planted weights
    assert "differs from the recorded" in book.problem(path, sha256_file(path))


def test_checkpoint_without_record_is_refused(tmp_path: Path, book: DigestBook) -> None:
    path = tmp_path / "checkpoint.pt"
    torch.save({"w": torch.ones(3)}, path)
    assert "no digest of it was recorded" in book.problem(path, sha256_file(path))


def test_a_crash_between_expect_and_rename_leaves_both_files_acceptable(
    tmp_path: Path, book: DigestBook
) -> None:
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(b"old")
    book.settle(path, sha256_file(path))
    book.expect(path, hashlib.sha256(b"new").hexdigest())  # then the process dies
    assert book.problem(path, sha256_file(path)) == ""
    path.write_bytes(b"new")
    assert book.problem(path, sha256_file(path)) == ""
    book.settle(path, sha256_file(path))
    path.write_bytes(b"old")
    assert book.problem(path, sha256_file(path)) != ""


def test_writer_records_every_name_it_writes(tmp_path: Path, book: DigestBook) -> None:
    paths = [tmp_path / "checkpoint.pt", tmp_path / "best_model.pt"]
    write_all({"w": torch.ones(2)}, paths, book)
    assert [book.problem(p, sha256_file(p)) for p in paths] == ["", ""]


def test_a_record_others_can_write_is_not_trusted(tmp_path: Path, book: DigestBook) -> None:
    path = save_checkpoint({"w": torch.ones(3)}, tmp_path / "checkpoint.pt", book)
    book.record_path(path).chmod(0o666)
    assert "cannot be trusted" in book.problem(path, sha256_file(path))
