"""The SVG loss curves: well-formed, every finite point drawn, axes as the values ask."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

from hypothesis import given
from hypothesis import strategies as st

from ufsemulator.training.losscurve import loss_curves_svg

NS = "{http://www.w3.org/2000/svg}"


def _parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def _polylines(root: ET.Element) -> list[list[tuple[float, float]]]:
    return [
        [tuple(map(float, p.split(","))) for p in line.attrib["points"].split()]  # type: ignore[misc]
        for line in root.iter(f"{NS}polyline")
    ]


def _texts(root: ET.Element) -> list[str]:
    return [t.text or "" for t in root.iter(f"{NS}text")]


def test_both_curves_have_a_point_per_epoch_and_lower_loss_is_drawn_lower() -> None:
    root = _parse(loss_curves_svg([1.0, 0.1, 0.01], [2.0, 0.2, 0.02], 3, "run"))
    train, val = _polylines(root)
    assert len(train) == len(val) == 3
    assert [x for x, _ in train] == sorted(x for x, _ in train)  # epochs left to right
    assert train[0][1] < train[1][1] < train[2][1]  # SVG y grows downwards
    assert all(v[1] < t[1] for t, v in zip(train, val, strict=True))  # validation higher


def test_positive_losses_get_a_log_axis_of_decades() -> None:
    texts = _texts(_parse(loss_curves_svg([0.5, 0.004], [0.6, 0.005], None, "t")))
    assert {"1e-3", "1e-2", "1e-1", "1e0"} <= set(texts)


def test_equal_losses_at_a_power_of_ten_keep_every_tick_inside() -> None:
    root = _parse(loss_curves_svg([0.1], [0.1], 1, "t"))
    ticks = [t for t in root.iter(f"{NS}text") if (t.text or "").startswith("1e")]
    assert [t.text for t in ticks] == ["1e-1"]
    assert all(40 <= float(t.attrib["y"]) - 4 <= 400 for t in ticks)


def test_a_zero_loss_gets_a_linear_axis() -> None:
    texts = _texts(_parse(loss_curves_svg([0.0, 1.0], [0.5, 0.5], None, "t")))
    assert "1e0" not in texts and "0" in texts and "1" in texts


def test_the_best_epoch_is_marked_and_named_in_the_legend() -> None:
    root = _parse(loss_curves_svg([3.0, 2.0, 1.0], [3.0, 1.0, 2.0], 2, "t"))
    assert "best (epoch 2)" in _texts(root)
    dashed = [line for line in root.iter(f"{NS}line") if "stroke-dasharray" in line.attrib]
    assert dashed
    root = _parse(loss_curves_svg([3.0, 2.0], [3.0, 1.0], 5, "t"))  # outside: no marker line
    assert not [
        line
        for line in root.iter(f"{NS}line")
        if "stroke-dasharray" in line.attrib and line.attrib["y1"] != line.attrib["y2"]
    ]


def test_a_title_with_markup_is_text() -> None:
    title = 'ufsemulator <aice> & "x"; rm -rf ~'
    root = _parse(loss_curves_svg([1.0], [1.0], 1, title))
    assert title in _texts(root)


def test_no_history_is_still_a_drawing() -> None:
    root = _parse(loss_curves_svg([], [], None, "empty"))
    assert _polylines(root) == []


@given(
    st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), max_size=60),
    st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), max_size=60),
    st.one_of(st.none(), st.integers(-3, 70)),
)
def test_any_history_is_well_formed_and_draws_each_finite_point_inside(
    train: list[float], val: list[float], best: int | None
) -> None:
    root = _parse(loss_curves_svg(train, val, best, "h"))
    lines = _polylines(root)
    finite = [sum(math.isfinite(v) for v in curve) for curve in (train, val)]
    assert [len(line) for line in lines] == [k for k in finite if k]
    for line in lines:
        for x, y in line:
            assert 70 - 1e-6 <= x <= 680 + 1e-6 and 40 - 1e-6 <= y <= 400 + 1e-6
    for grid in root.iter(f"{NS}line"):  # ticks, the best epoch, the legend: in the frame
        assert all(40 - 1e-6 <= float(grid.attrib[k]) <= 400 + 1e-6 for k in ("y1", "y2"))
