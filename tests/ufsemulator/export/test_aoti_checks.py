"""The checks of ufsemulator.export.aoti.load's calls, without compiling a package (the
package itself: tests/ufsemulator/export/test_cxx_example.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ufsemulator.export.aoti import Program, arguments


def program(model: str) -> tuple[Program, list[Any]]:
    seen: list[Any] = []

    def runner(*tensors: torch.Tensor) -> str:
        seen.append(tensors)
        return "ran"

    runner.loader = None  # type: ignore[attr-defined]
    return Program(runner, model, arguments(model, 14, 1)), seen


X, MASK = torch.zeros(8, 14), torch.ones(8, 1)


@pytest.mark.parametrize(
    ("model", "tensors", "message"),
    [
        ("jac_physical", (X.double(), MASK), r"jac_physical: inputs must be float32 .*float64"),
        ("jac_physical", (X[:, :13], MASK), r"inputs must be \[8, 14\], got \[8, 13\]"),
        ("jac_physical", (X, MASK[:5]), r"mask must be \[8, 1\], got \[5, 1\]"),
        ("jac_physical", (X, MASK.reshape(8)), r"mask must be \[8, 1\], got \[8\]"),
        ("jac_physical", (X,), r"jac_physical takes \(inputs, mask\), got 1 tensors"),
        ("tlm", (X, X[:, :1], MASK), r"tlm: dx must be \[8, 14\], got \[8, 1\]"),
        ("adjoint", (X, X, MASK), r"adjoint: dy must be \[8, 1\], got \[8, 14\]"),
        ("predict", (X.half(),), r"predict: inputs must be float32 .*float16"),
    ],
)
def test_bad_inputs_are_refused_naming_the_input(
    model: str, tensors: tuple[torch.Tensor, ...], message: str
) -> None:
    call, seen = program(model)
    with pytest.raises(ValueError, match=message):
        call(*tensors)
    assert seen == []


def test_a_strided_view_is_copied_and_rows_of_any_count_pass() -> None:
    call, seen = program("jac_physical")
    view = torch.zeros(14, 8).t()
    assert call(view, MASK) == "ran" and seen[0][0].is_contiguous()
    for rows in (0, 1, 7):
        assert call(X[:rows], MASK[:rows]) == "ran"


def test_a_program_the_package_lacks_is_named() -> None:
    with pytest.raises(ValueError, match="programs predict, jac_physical, tlm, adjoint, not 'fwd'"):
        arguments("fwd", 14, 1)
