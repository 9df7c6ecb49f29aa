"""The array cache written after the read returns: whole once written, a warning if not."""

from __future__ import annotations

import threading
from pathlib import Path

import netCDF4
import numpy as np
import pytest

from ufsemulator.data import background, read
from ufsemulator.data.read import DataOptions, load_dataset, make_synthetic


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_synthetic(tmp_path_factory.mktemp("data") / "iceh.nc", ni=24, nj=20, seed=0)


def test_the_read_returns_before_its_cache_is_written_and_the_cache_is_whole_after(
    synthetic: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    real = read._save_cache

    def held(path: Path, dataset: read.Dataset) -> None:
        assert release.wait(10)
        real(path, dataset)

    monkeypatch.setattr(read, "_save_cache", held)
    options = DataOptions(mask="both", cache_dir=tmp_path)
    first = load_dataset(synthetic, options, cache_in_background=True)
    assert list(tmp_path.glob("*.npz")) == []  # returned while the write waits
    release.set()
    assert background.wait(10)
    assert len(list(tmp_path.glob("*.npz"))) == 1

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("netCDF reopened on a cache hit")

    monkeypatch.setattr(netCDF4, "Dataset", refuse)
    second = load_dataset(synthetic, options)
    for name in ("inputs", "targets", "index", "record", "file"):
        np.testing.assert_array_equal(getattr(first, name), getattr(second, name))


def test_a_cache_that_cannot_be_written_is_one_warning_not_an_error(
    synthetic: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def full(path: Path, dataset: read.Dataset) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(read, "_save_cache", full)
    dataset = load_dataset(synthetic, DataOptions(cache_dir=tmp_path), cache_in_background=True)
    assert background.wait(10) and len(dataset) > 0
    err = capsys.readouterr().err
    assert err.startswith("Warning: array cache ") and "No space left on device" in err
    assert list(tmp_path.glob("*.npz")) == []


def test_wait_says_whether_the_writes_ended() -> None:
    release = threading.Event()
    background.start("slow write", lambda: release.wait(10) and None)
    assert not background.wait(0.05)
    release.set()
    assert background.wait(10)
