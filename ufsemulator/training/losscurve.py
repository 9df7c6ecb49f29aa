"""The loss curves of a run as an SVG drawing, written in a few milliseconds.

A job's last act is this picture, and importing matplotlib for it took most of a second
(more on a cluster's shared file system) after the model was already on disk: time the
user waits for nothing. An SVG is text: two polylines, axes and a legend, which any
browser shows. The y axis is logarithmic (decades) when every loss is positive.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape

WIDTH, HEIGHT = 700, 450
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 40, 50
COLOURS = {"train": "#1f77b4", "validation": "#ff7f0e"}


def loss_curves_svg(
    train_loss: Sequence[float],
    val_loss: Sequence[float],
    best_epoch: int | None,
    title: str,
) -> str:
    """The drawing: loss per epoch (epoch 1 at the left), both curves, the best epoch."""
    curves = {"train": list(train_loss), "validation": list(val_loss)}
    axes = _Axes.fit(curves, n=max(len(train_loss), len(val_loss)))
    plot_w, plot_h = axes.plot_w, axes.plot_h
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{WIDTH / 2}" y="22" text-anchor="middle" font-size="14">{escape(title)}</text>',
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" '
        'stroke="black"/>',
        *_grid(axes, best_epoch),
        *_polylines(axes, curves),
        *_legend([*curves], best_epoch, x=LEFT + plot_w - 150),
        f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 12}" text-anchor="middle">epoch</text>',
        f'<text x="16" y="{TOP + plot_h / 2}" text-anchor="middle" '
        f'transform="rotate(-90 16 {TOP + plot_h / 2})">loss (normalised units)</text>',
        "</svg>",
    ]
    return "\n".join(parts) + "\n"


@dataclass(frozen=True)
class _Axes:
    """Where an epoch and a loss go in the drawing."""

    n: int  # epochs
    lo: float  # the y axis, in scaled units (decades on a log axis)
    hi: float
    log: bool
    plot_w: int = WIDTH - LEFT - RIGHT
    plot_h: int = HEIGHT - TOP - BOTTOM

    @classmethod
    def fit(cls, curves: dict[str, list[float]], n: int) -> _Axes:
        values = [v for curve in curves.values() for v in curve if math.isfinite(v)]
        log = bool(values) and all(v > 0 for v in values)
        scale = math.log10 if log else float
        lo = scale(min(values)) if values else 0.0
        hi = scale(max(values)) if values else 1.0
        if log:
            lo, hi = math.floor(lo), math.ceil(hi)
        if not hi > lo:  # one value (or all equal): a band around it, wide enough to show
            pad = max(0.5, abs(lo) / 100)
            lo, hi = lo - pad, hi + pad
        return cls(n=n, lo=lo, hi=hi, log=log)

    def x_at(self, epoch: float) -> float:
        n = self.n
        return LEFT + (0.5 if n <= 1 else (epoch - 1) / (n - 1)) * self.plot_w

    def y_at(self, value: float) -> float:
        scaled = math.log10(value) if self.log else float(value)
        return TOP + (1 - (scaled - self.lo) / (self.hi - self.lo)) * self.plot_h


def _grid(axes: _Axes, best_epoch: int | None) -> list[str]:
    """The tick lines and labels of both axes, and the best epoch's dashed line."""
    parts = []
    right, bottom = LEFT + axes.plot_w, TOP + axes.plot_h
    for value, label in _y_ticks(axes.lo, axes.hi, axes.log):
        y = axes.y_at(value)
        parts.append(
            f'<line x1="{LEFT}" x2="{right}" y1="{y:.1f}" y2="{y:.1f}" '
            'stroke="#ccc"/>'
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>'
        )
    for epoch in _x_ticks(axes.n):
        x = axes.x_at(epoch)
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{bottom}" stroke="#eee"/>'
            f'<text x="{x:.1f}" y="{bottom + 16}" text-anchor="middle">{epoch}</text>'
        )
    if best_epoch is not None and 1 <= best_epoch <= axes.n:
        x = axes.x_at(best_epoch)
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{bottom}" stroke="grey" '
            'stroke-dasharray="2,3"/>'
        )
    return parts


def _polylines(axes: _Axes, curves: dict[str, list[float]]) -> list[str]:
    """One line per curve through its finite values (none for a curve without any)."""
    parts = []
    for name, curve in curves.items():
        points = " ".join(
            f"{axes.x_at(i):.1f},{axes.y_at(v):.1f}"
            for i, v in enumerate(curve, 1)
            if math.isfinite(v)
        )
        if points:
            parts.append(
                f'<polyline fill="none" stroke="{COLOURS[name]}" stroke-width="1.5" '
                f'points="{points}"/>'
            )
    return parts


def _legend(names: list[str], best_epoch: int | None, x: int) -> list[str]:
    legend = [(name, COLOURS[name], "") for name in names]
    if best_epoch is not None:
        legend.append((f"best (epoch {best_epoch})", "grey", ' stroke-dasharray="2,3"'))
    parts = []
    for row, (name, colour, dash) in enumerate(legend):
        y = TOP + 16 + 16 * row
        parts.append(
            f'<line x1="{x}" x2="{x + 24}" y1="{y - 4}" y2="{y - 4}" stroke="{colour}" '
            f'stroke-width="1.5"{dash}/><text x="{x + 30}" y="{y}">{escape(name)}</text>'
        )
    return parts


def _y_ticks(lo: float, hi: float, log: bool) -> list[tuple[float, str]]:
    """(value, label) pairs: every decade on a log axis, five steps on a linear one."""
    if log:
        return [(10.0**d, f"1e{d}") for d in range(math.ceil(lo), math.floor(hi) + 1)]
    return [(lo + (hi - lo) * k / 5, f"{lo + (hi - lo) * k / 5:.3g}") for k in range(6)]


def _x_ticks(n: int) -> list[int]:
    """Up to about eight whole epochs from 1 to ``n``, evenly spaced."""
    if n <= 1:
        return [1] if n == 1 else []
    step = max(1, math.ceil((n - 1) / 8))
    ticks = list(range(1, n + 1, step))
    return ticks if ticks[-1] == n else [*ticks, n]
