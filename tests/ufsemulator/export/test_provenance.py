"""The data's identity in an export's provenance: each file's SHA-256 as sha256sum prints
it, one digest over the files in order, hashed on several threads or on a thread of its
own while a GPU trains."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from ufsemulator.config import Config
from ufsemulator.export import provenance
from ufsemulator.export.runrecord import data_record, data_record_later


def _files(tmp_path: Path, contents: list[bytes]) -> list[Path]:
    paths = []
    for index, content in enumerate(contents):
        path = tmp_path / f"part{index}.bin"
        path.write_bytes(content)
        paths.append(path)
    return paths


@pytest.mark.parametrize("workers", [1, 2, 5])
def test_each_files_digest_is_what_sha256sum_prints_whatever_the_threads(
    tmp_path: Path, workers: int
) -> None:
    paths = _files(tmp_path, [b"a" * 100, b"", bytes(range(256)) * 40_000, b"z"])
    printed = subprocess.run(
        ["sha256sum", *map(str, paths)], capture_output=True, text=True, check=True
    ).stdout
    expected = [line.split()[0] for line in printed.splitlines()]
    assert provenance.files_sha256(paths, workers=workers) == expected


def test_the_combined_digest_changes_when_bytes_move_from_one_file_to_the_next(
    tmp_path: Path,
) -> None:
    for name in "abc":
        (tmp_path / name).mkdir()
    first = _files(tmp_path / "a", [b"abc", b"def"])
    moved = _files(tmp_path / "b", [b"abcd", b"ef"])
    same = _files(tmp_path / "c", [b"abc", b"def"])
    assert provenance.content_sha256(first) != provenance.content_sha256(moved)
    assert provenance.content_sha256(first) == provenance.content_sha256(same)
    sizes_and_digests = "".join(
        f"{path.stat().st_size} {hashlib.sha256(path.read_bytes()).hexdigest()}\n" for path in first
    )
    assert (
        provenance.content_sha256(first) == hashlib.sha256(sizes_and_digests.encode()).hexdigest()
    )


def test_the_record_made_on_a_thread_of_its_own_is_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Files without a netCDF time axis: the record times are those of a bare series.
    monkeypatch.setattr(provenance, "record_times", lambda paths, time="all": (None, None))
    paths = _files(tmp_path, [b"x" * 1000, b"y" * 3000])
    config = Config()
    later = data_record_later(config, [str(p) for p in paths]).result(timeout=60)
    now = data_record(config, [str(p) for p in paths])
    assert later == now
    assert later["files_sha256"] == [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]
    assert later["paths"] == [str(p.resolve()) for p in paths]
