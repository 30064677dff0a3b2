"""Inline SVG charts drawn by the server: lines with limit lines, and stacked bars.

Pure functions from numbers to markup (no I/O, no clock). Every text that reaches the markup
is escaped. Colours come from CSS classes (``bot.web.assets``), so the charts follow the
page's light or dark scheme. Each series carries ``data-series`` and ``data-last`` (its newest
value, "" when it has none), which the browser tests read and screen readers skip.

Invariants:
- The drawing scales to its box (``viewBox``, width 100%): readable on a phone.
- A missing value (None) is a gap in the line, never a zero.
- Output size is bounded by the number of points (60 or 96 per series), whatever the values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

W, H = 600.0, 170.0
LEFT, RIGHT, TOP, BOTTOM = 34.0, 8.0, 10.0, 20.0


@dataclass(frozen=True)
class Line:
    name: str  # shown in the legend
    key: str  # CSS class suffix and data-series
    values: Sequence[float | None]


@dataclass(frozen=True)
class Limit:
    name: str
    value: float


def _fmt(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".")


def _scale_max(values: Sequence[float], floor: float) -> float:
    top = max([floor, *values])
    if top <= 0:
        return 1.0
    magnitude = 10 ** math.floor(math.log10(top))
    for step in (1, 2, 2.5, 5, 10):
        if top <= step * magnitude:
            return float(step * magnitude)
    return float(10 * magnitude)


def _frame(chart_id: str, title: str, ymax: float, unit: str, left: str, right: str) -> list[str]:
    plot_h = H - TOP - BOTTOM
    out = [
        f'<svg id="{escape(chart_id)}" class="chart" viewBox="0 0 {W:.0f} {H:.0f}" '
        f'role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
    ]
    for frac in (0.0, 0.5, 1.0):
        y = TOP + plot_h * (1 - frac)
        out.append(f'<line class="grid" x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>')
        out.append(
            f'<text class="axis" x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end">'
            f"{_fmt(ymax * frac)}{escape(unit)}</text>"
        )
    out.append(f'<text class="axis" x="{LEFT}" y="{H - 4}">{escape(left)}</text>')
    out.append(
        f'<text class="axis" x="{W - RIGHT}" y="{H - 4}" text-anchor="end">{escape(right)}</text>'
    )
    return out


def line_chart(
    chart_id: str,
    title: str,
    lines: Sequence[Line],
    *,
    limits: Sequence[Limit] = (),
    unit: str = "%",
    floor: float = 10.0,
    left: str = "",
    right: str = "now",
) -> str:
    known = [v for line in lines for v in line.values if v is not None]
    ymax = _scale_max([*known, *(lim.value for lim in limits)], floor)
    out = _frame(chart_id, title, ymax, unit, left, right)
    plot_w, plot_h = W - LEFT - RIGHT, H - TOP - BOTTOM

    def y_of(v: float) -> float:
        return TOP + plot_h * (1 - min(max(v, 0.0), ymax) / ymax)

    for lim in limits:
        y = y_of(lim.value)
        out.append(
            f'<line class="limit" x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}">'
            f"<title>{escape(lim.name)}: {_fmt(lim.value)}{escape(unit)}</title></line>"
        )
        out.append(
            f'<text class="limit-label" x="{W - RIGHT - 2}" y="{y - 3:.1f}" '
            f'text-anchor="end">{escape(lim.name)}</text>'
        )
    for line in lines:
        n = len(line.values)
        step = plot_w / max(1, n - 1)
        segments: list[list[str]] = [[]]
        for i, v in enumerate(line.values):
            if v is None:
                if segments[-1]:
                    segments.append([])
                continue
            segments[-1].append(f"{LEFT + i * step:.1f},{y_of(v):.1f}")
        last = next((v for v in reversed(line.values) if v is not None), None)
        path = " ".join(
            "M" + " L".join(s) if len(s) > 1 else f"M{s[0]} l1,0" for s in segments if s
        )
        out.append(
            f'<path class="series s-{escape(line.key)}" data-series="{escape(line.key)}" '
            f'data-last="{"" if last is None else _fmt(last)}" d="{path}">'
            f"<title>{escape(line.name)}</title></path>"
        )
    out.append("</svg>")
    legend = "".join(
        f'<span class="key s-{escape(line.key)}">{escape(line.name)}</span>' for line in lines
    )
    return "".join(out) + f'<div class="legend">{legend}</div>'


def bar_chart(
    chart_id: str,
    title: str,
    lines: Sequence[Line],
    *,
    left: str = "",
    right: str = "now",
) -> str:
    """Stacked bars, one per slot; ``lines`` are the stacked series (counts)."""
    n = max((len(line.values) for line in lines), default=0)
    stacks = [sum((line.values[i] or 0.0) for line in lines) for i in range(n)]
    ymax = _scale_max(stacks, 4.0)
    out = _frame(chart_id, title, ymax, "", left, right)
    plot_w, plot_h = W - LEFT - RIGHT, H - TOP - BOTTOM
    slot = plot_w / max(1, n)
    for line in lines:
        total = sum(v or 0.0 for v in line.values)
        out.append(
            f'<g class="series s-{escape(line.key)}" data-series="{escape(line.key)}" '
            f'data-last="{_fmt(total)}"><title>{escape(line.name)}</title>'
        )
        out.append("</g>")
    base = [0.0] * n
    for line in lines:
        for i, v in enumerate(line.values):
            if not v:
                continue
            h = plot_h * v / ymax
            y = TOP + plot_h - base[i] - h
            base[i] += h
            out.append(
                f'<rect class="bar s-{escape(line.key)}" x="{LEFT + i * slot + 0.5:.1f}" '
                f'y="{y:.1f}" width="{max(1.0, slot - 1):.1f}" height="{h:.1f}">'
                f"<title>{escape(line.name)}: {_fmt(v)}</title></rect>"
            )
    out.append("</svg>")
    legend = "".join(
        f'<span class="key s-{escape(line.key)}">{escape(line.name)}</span>' for line in lines
    )
    return "".join(out) + f'<div class="legend">{legend}</div>'
