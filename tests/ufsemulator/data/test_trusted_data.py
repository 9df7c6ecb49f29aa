"""A data file is read once and hashed as read; the array cache is used only where the user
alone can write and only as written."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from ufsemulator.data import arraycache
from ufsemulator.data.onceread import read_file
from ufsemulator.data.read import DataOptions, load_dataset
from ufsemulator.data.synthfiles import make_synthetic
from ufsemulator.errors import DataError


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    path = tmp_path / "day.nc"
    make_synthetic(path, ni=40, nj=32, seed=0)
    return path


def test_digest_is_of_the_bytes_read(data: Path) -> None:
    found = read_file(data)
    assert found.sha256 == hashlib.sha256(data.read_bytes()).hexdigest()
    dataset = load_dataset(data)
    assert [(p, s) for _, p, s, _ in dataset.file_digests] == [(str(data.resolve()), found.sha256)]


def test_file_rewritten_while_read_is_refused(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    monkeypatch.setenv("HPCDIST_TEST_PAUSE", f"data-read:{hooks}")

    def rewrite() -> None:
        while not (hooks / "data-read.ready").exists():
            pass
        with open(data, "r+b") as handle:  # in place, as a group-writable file allows
            handle.write(b"\x00")
        (hooks / "data-read.go").touch()

    helper = threading.Thread(target=rewrite)
    helper.start()
    with pytest.raises(DataError, match=rf"data file '{data}' changed while it was read"):
        read_file(data)
    helper.join()


def test_cache_is_used_only_as_written(data: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    options = DataOptions(cache_dir=cache)
    first = load_dataset(data, options)
    [written] = list(cache.glob("*.npz"))
    assert written.stat().st_mode & 0o777 == 0o600
    again = load_dataset(data, options)
    assert again.bytes_read == written.stat().st_size  # from the cache
    assert again.file_digests == first.file_digests  # it names the bytes it was made from
    written.write_bytes(written.read_bytes() + b"\x00")  # changed since it was written
    assert arraycache.load_bytes(written) is None
    os.chown(written, 4242, -1)
    assert arraycache.load_bytes(written) is None


def test_cache_is_never_written_where_others_can_write(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    load_dataset(data, DataOptions(cache_dir=shared))
    assert list(shared.iterdir()) == []
    assert f"not writing the array cache in '{shared}' is writable by" in capsys.readouterr().err
