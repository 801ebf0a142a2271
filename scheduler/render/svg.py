"""Inline SVG charts for self-contained HTML pages: grouped bars and time lines.

No JavaScript, no stylesheet or font from the network: a page must open from a file on an
air-gapped machine. Every name that reaches a chart comes from the ledger, i.e. from
users, so every one goes through ``esc``. Used by ``projections.html`` (the report page)
and ``replay.compare`` (the comparison page); it imports only ``events.ledgertime``.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

from events.ledgertime import format_duration

__all__ = ["PALETTE", "bar_chart", "esc", "line_chart"]

PALETTE = ("#4269d0", "#efb118", "#ff725c", "#6cc5b0", "#3ca951", "#ff8ab7", "#a463f2", "#97bbf5")
_W, _H = 720, 260
_LEFT, _RIGHT, _TOP, _BOTTOM = 60, 150, 30, 40


def esc(value: Any) -> str:
    """Text made safe for HTML and SVG, quotes included."""
    return html.escape(str(value), quote=True)


def _nice_max(value: float) -> float:
    if value <= 0 or not math.isfinite(value):
        return 1.0
    exp = 10.0 ** math.floor(math.log10(value))
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        if value <= m * exp:
            return float(m * exp)
    return float(10 * exp)


def _frame(title: str, y_max: float, y_fmt: str) -> list[str]:
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
        f'viewBox="0 0 {_W} {_H}" role="img" aria-label="{esc(title)}">',
        f'<title>{esc(title)}</title><rect width="{_W}" height="{_H}" fill="#fff"/>',
        f'<text x="{_LEFT}" y="18" font-size="13" font-weight="bold">{esc(title)}</text>',
    ]
    plot_h = _H - _TOP - _BOTTOM
    for i in range(5):
        y = _TOP + plot_h - plot_h * i / 4
        label = y_max * i / 4
        text = _value_label(label, y_fmt)
        parts.append(
            f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>'
            f'<text x="{_LEFT - 4}" y="{y + 4:.1f}" font-size="10" text-anchor="end">'
            f"{esc(text)}</text>"
        )
    return parts


def _value_label(value: float, fmt: str) -> str:
    return format_duration(value) if fmt == "duration" else f"{value:g}"


def _x_label(x: float, text: str) -> str:
    """A label under the plot, centred on ``x``."""
    return (
        f'<text x="{x:.1f}" y="{_H - _BOTTOM + 14}" font-size="10" '
        f'text-anchor="middle">{esc(text)}</text>'
    )


def _finish(parts: list[str], names: Sequence[str]) -> str:
    """The chart's SVG: ``parts``, then a legend of the series ``names``."""
    for i, name in enumerate(names):
        y = _TOP + 14 * i
        parts.append(
            f'<rect x="{_W - _RIGHT + 10}" y="{y}" width="10" height="10" '
            f'fill="{PALETTE[i % len(PALETTE)]}"/>'
            f'<text x="{_W - _RIGHT + 24}" y="{y + 9}" font-size="11">{esc(name)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def bar_chart(
    title: str,
    categories: Sequence[str],
    series: Mapping[str, Sequence[float | None]],
    *,
    y_format: str = "number",
) -> str:
    """Grouped bars: one group per category, one bar per series (None draws nothing)."""
    values = [v for vs in series.values() for v in vs if v is not None]
    y_max = _nice_max(max(values, default=0.0))
    parts = _frame(title, y_max, y_format)
    plot_w = _W - _LEFT - _RIGHT
    plot_h = _H - _TOP - _BOTTOM
    group = plot_w / max(1, len(categories))
    bar = group * 0.8 / max(1, len(series))
    for c, category in enumerate(categories):
        x0 = _LEFT + c * group + group * 0.1
        for s, (name, vs) in enumerate(series.items()):
            v = vs[c]
            if v is None:
                continue
            h = plot_h * v / y_max
            label = _value_label(v, y_format)
            parts.append(
                f'<rect x="{x0 + s * bar:.1f}" y="{_TOP + plot_h - h:.1f}" '
                f'width="{max(bar - 1, 1):.1f}" height="{h:.1f}" '
                f'fill="{PALETTE[s % len(PALETTE)]}"><title>{esc(category)} {esc(name)}: '
                f"{esc(label)}</title></rect>"
            )
        parts.append(_x_label(x0 + group * 0.4, category))
    return _finish(parts, list(series))


def line_chart(
    title: str, series: Mapping[str, Sequence[tuple[float, float]]], *, y_label: str = ""
) -> str:
    """One polyline per series of (x seconds, y) points, x on a shared time axis."""
    xs = [x for pts in series.values() for x, _ in pts]
    ys = [y for pts in series.values() for _, y in pts]
    y_max = _nice_max(max(ys, default=0.0))
    x_min, x_max = (min(xs), max(xs)) if xs else (0.0, 1.0)
    span = (x_max - x_min) or 1.0
    parts = _frame(f"{title} ({y_label})" if y_label else title, y_max, "number")
    plot_w = _W - _LEFT - _RIGHT
    plot_h = _H - _TOP - _BOTTOM
    for i, (_name, pts) in enumerate(series.items()):
        coords = " ".join(
            f"{_LEFT + plot_w * (x - x_min) / span:.1f},{_TOP + plot_h - plot_h * y / y_max:.1f}"
            for x, y in pts
        )
        parts.append(
            f'<polyline points="{coords}" fill="none" stroke-width="1.5" '
            f'stroke="{PALETTE[i % len(PALETTE)]}"/>'
        )
    for frac in (0.0, 0.5, 1.0):
        parts.append(_x_label(_LEFT + plot_w * frac, format_duration(x_min + span * frac)))
    return _finish(parts, list(series))
