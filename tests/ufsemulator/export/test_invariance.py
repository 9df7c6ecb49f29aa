"""Batch invariance of the export: a row's results have the same bits whether it comes
alone, in a few rows or in a batch of 100,000, at 1 and at 2 threads, for predict,
jac_physical, tlm and adjoint, in float32 and float64 (TorchScript, as C++ loads it; the
AOTInductor package and the C++ example: tests/ufsemulator/export/test_cxx_example.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from ufsemulator.config import ExportConfig
from ufsemulator.export.torchscript import export_model

from .test_export import _load, aice_model

ROWS = 100_000
PROBED = (0, 1, 2, 255, 256, 257, ROWS // 2, ROWS - 1)


@pytest.fixture(scope="module")
def module(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = tmp_path_factory.mktemp("invariance") / "model.pt"
    return _load(export_model(aice_model(), path, ExportConfig(names="jedi")))


@pytest.fixture
def threads(request: pytest.FixtureRequest) -> Iterator[int]:
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def methods(module: Any, dtype: torch.dtype) -> dict[str, Callable[[slice], torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    x = (module.input_mean + module.input_std * torch.randn(ROWS, 14, generator=g)).to(dtype)
    dx = torch.randn(ROWS, 14, generator=g, dtype=dtype)
    dy = torch.randn(ROWS, 1, generator=g, dtype=dtype)
    mask = torch.ones(ROWS, 1)
    return {
        "predict": lambda s: module.predict(x[s]),
        "jac_physical": lambda s: module.jac_physical(x[s], mask[s]),
        "tlm": lambda s: module.tlm(x[s], dx[s]),
        "adjoint": lambda s: module.adjoint(x[s], dy[s]),
    }


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.slow
def test_a_rows_bits_do_not_depend_on_its_batch(
    module: Any, dtype: torch.dtype, threads: int
) -> None:
    for name, call in methods(module, dtype).items():
        batch = call(slice(0, ROWS))
        for row in PROBED:
            for start, stop in ((row, row + 1), (max(0, row - 3), min(ROWS, row + 4))):
                alone = call(slice(start, stop))[row - start]
                assert torch.equal(alone, batch[row]), (name, dtype, threads, row, stop - start)


def test_the_bits_do_not_depend_on_the_threads(module: Any) -> None:
    before = torch.get_num_threads()
    answers = []
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            answers.append(
                {k: c(slice(0, 20_000)) for k, c in methods(module, torch.float32).items()}
            )
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(answers[0][k], answers[1][k]) for k in answers[0])


def test_zero_rows_give_empty_answers(module: Any, tmp_path: Path) -> None:
    x = torch.zeros(0, 14)
    assert module.predict(x).shape == (0, 1) and module.row_flags(x).shape == (0,)
    assert module.jac_physical(x, torch.zeros(0, 1)).shape == (0, 1, 14)
    assert module.tlm(x, x).shape == (0, 1) and module.adjoint(x, torch.zeros(0, 1)).shape == (
        0,
        14,
    )
