"""A rank's read started before torch: the read ``train`` would make, or nothing."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import pytest

from tests.ufsemulator.training.test_training import data_dir, run_single, single_process, smoke  # noqa: F401
from ufsemulator.config import Config
from ufsemulator.data.makedays import write_days
from ufsemulator.data.read import DataOptions, load_dataset
from ufsemulator.errors import DataError
from ufsemulator.training import earlyread
from ufsemulator.training.earlyread import EarlyRead, read_request


@pytest.fixture(scope="module")
def days(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    folder = tmp_path_factory.mktemp("days")
    return [str(p) for p in write_days(folder, 40, 32, 4, jobs=1).paths]


def _with_data(config: Config, path: object, read_early: bool = True) -> Config:
    """``config`` on the files ``path``, with the early read on (it is off by default)."""
    data = dataclasses.replace(config.data, path=path, read_early=read_early)
    return dataclasses.replace(config, data=data)


@pytest.mark.parametrize(
    ("files", "world", "share"),
    [
        (1, 1, None),  # one file: every rank reads it whole
        (2, 1, (0, 1)),
        (3, 4, None),  # fewer files than ranks
        (4, 4, (2, 4)),  # as many files as ranks
        (4, 2, (1, 2)),
    ],
)
def test_a_rank_reads_in_shares_where_every_rank_has_a_file(
    days: list[str], files: int, world: int, share: tuple[int, int] | None
) -> None:
    rank = share[0] if share is not None else world - 1
    request = read_request(smoke(), days[:files], rank, world, {"HPCDIST_DATA_DIR": "/c"})
    assert request.share == share
    assert request.options.cache_dir == Path("/c")


def test_the_read_started_early_is_the_one_train_would_make(
    tmp_path: Path, days: list[str]
) -> None:
    request = read_request(smoke(), days, 1, 2, {"HPCDIST_DATA_DIR": str(tmp_path)})
    other = EarlyRead(request)
    assert other.take(dataclasses.replace(request, share=(0, 2))) is None  # another read
    early = EarlyRead(request)
    taken = early.take(request)
    assert taken is not None and early.seconds > 0
    assert early.started < early.finished <= time.perf_counter()
    direct = load_dataset(days, dataclasses.replace(request.options, cache_dir=None), share=(1, 2))
    assert np.array_equal(taken.inputs, direct.inputs) and taken.files_read == (2, 4)
    assert taken.bytes_read == direct.bytes_read  # the netCDF files', not the cache's
    assert len(list(tmp_path.glob("*.npz"))) == 1  # the child left it there


def test_a_failed_early_read_leaves_the_read_to_train(tmp_path: Path, days: list[str]) -> None:
    broken = tmp_path / "broken.nc"
    broken.write_text("not netCDF")
    request = read_request(smoke(), [days[0], str(broken)], 1, 2, {})
    assert EarlyRead(request).take(request) is None
    with pytest.raises(DataError, match=r"cannot open .*broken\.nc' as netCDF"):
        load_dataset(request.path, request.options, share=request.share)


def test_an_early_read_needs_the_cache(days: list[str]) -> None:
    request = read_request(smoke(), days, 0, 1, {})
    with pytest.raises(ValueError, match="give a cache_dir"):
        EarlyRead(dataclasses.replace(request, options=DataOptions(cache_dir=None)))


def test_nothing_starts_without_files_or_when_switched_off(tmp_path: Path, days: list[str]) -> None:
    environ = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    environ.update(MASTER_ADDR="h", MASTER_PORT="29500")
    assert earlyread.start(smoke(), environ) is None  # synthetic data: rank 0 writes it
    assert earlyread.start(_with_data(smoke(), None), environ) is None
    off_by_default = dataclasses.replace(
        smoke(), data=dataclasses.replace(smoke().data, path=tuple(days))
    )
    assert earlyread.start(off_by_default, environ) is None
    assert earlyread.start(_with_data(smoke(), tuple(days), read_early=False), environ) is None
    environ["HPCDIST_DATA_DIR"] = str(tmp_path)
    early = earlyread.start(_with_data(smoke(), tuple(days)), environ)
    assert early is not None and early.request.share == (1, 2)  # from the launcher's variables
    assert early.take(early.request) is not None


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_a_run_trains_on_its_early_read(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    days: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = _with_data(smoke(epochs=1), tuple(days))
    early = earlyread.start(config, {"HPCDIST_DATA_DIR": str(tmp_path / "cache")})
    assert early is not None and early.request.share == (0, 1)
    monkeypatch.setenv("HPCDIST_DATA_DIR", str(tmp_path / "cache"))
    run_single(monkeypatch, config, run_dir=tmp_path / "run", early_read=early)
    assert "read while torch started (" in capsys.readouterr().out
    whole = load_dataset(days)
    results = json.loads((tmp_path / "run" / "training_results.json").read_text())
    assert results["n_train"] + results["n_val"] == len(whole)
