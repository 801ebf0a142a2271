"""Plain-text tables with human units: what every command and report prints.

``render_table`` aligns rows (dicts) under ``Column`` specs; ``format_value`` is one cell's
text (durations in ms/s/m/h/d, GPU hours, counts, measured numbers, SQL values as
``gpuledger sql`` shows them). Projections' reports, the simulator's comparisons and the
command line all print through here, so a number reads the same wherever it appears.
It sits below ``projections`` and ``replay`` (both use it) and imports only
``events.ledgertime``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from events.ledgertime import format_duration

__all__ = [
    "Column",
    "Unit",
    "format_number",
    "format_value",
    "layout",
    "number_decimals",
    "raw_decimals",
    "render_table",
    "resolve_unit",
]

Unit = Literal["auto", "text", "count", "number", "duration", "hours", "raw"]
"""How a column's values are shown.

``duration`` takes seconds and picks ms/s/m/h/d; ``hours`` is a quantity in hours (GPU
hours); ``count`` an integer; ``number`` a float; ``raw`` the value as DuckDB returned it
(for ``gpuledger sql``); ``auto`` picks from the column name and the value's type.
"""


@dataclass(frozen=True)
class Column:
    """One column of a rendered table: the row key, its header and its unit."""

    key: str
    header: str | None = None
    unit: Unit = "auto"

    @property
    def title(self) -> str:
        """The header text (the key when no header was given)."""
        return self.header if self.header is not None else self.key


_NUMERIC_UNITS = frozenset({"count", "number", "duration", "hours"})


def resolve_unit(column: Column, value: Any) -> Unit:
    if column.unit != "auto":
        return column.unit
    if column.key.endswith("_s"):
        return "duration"
    if column.key.endswith("_hours"):
        return "hours"
    if isinstance(value, bool):
        return "text"
    if isinstance(value, int):
        return "count"
    if isinstance(value, float):
        return "number"
    return "text"


def format_number(value: float) -> str:
    """A measured number as people read it, never in scientific notation: thousands
    grouped without decimals from 1,000 (``22,050``), then 1 decimal from 100 (``123.4``),
    2 from 1 (``12.35``), 3 below (``0.325``), and ``<0.001`` for what is not zero but
    would round to it (a ratio of 7e-07)."""
    v = float(value)
    a = abs(v)
    if math.isnan(v):
        return "NaN"
    if a == 0:
        return "0"
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    if a >= 0.0005:
        return f"{v:.3f}"
    return f"{'-' if v < 0 else ''}<0.001"


def _fixed(value: float, decimals: int) -> str:
    """``value`` with ``decimals`` decimals, thousands grouped; what is not zero but would
    round to it reads ``<0.01`` rather than a zero that is not one."""
    v = float(value)
    if math.isnan(v):
        return "NaN"
    if v != 0 and round(v, decimals) == 0:
        return f"{'-' if v < 0 else ''}<{10**-decimals:.{decimals}f}"
    return f"{v:,.{decimals}f}"


def number_decimals(values: Sequence[Any]) -> int:
    """The decimals of a column of measured numbers, from its largest magnitude (the ladder
    of ``format_number``): 0 from 1,000, 1 from 100, 2 from 1, 3 below."""
    biggest = max((abs(float(v)) for v in values if _is_number(v)), default=0.0)
    return 0 if biggest >= 1000 else 1 if biggest >= 100 else 2 if biggest >= 1 else 3


def raw_decimals(values: Sequence[Any]) -> int:
    """The decimals of a column of SQL floats: as many as its values need, at most 4."""
    need = 1
    for v in values:
        if isinstance(v, float) and math.isfinite(v):
            text = f"{v:.4f}".rstrip("0")
            need = max(need, len(text) - text.index(".") - 1)
    return need


def _raw(value: Any, decimals: int = 4) -> str:
    """A SQL value as ``sql`` shows it in a table: floats with the column's decimals (no
    binary noise such as 0.03149972222222222), booleans as true/false, NULL spelt out."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return _fixed(value, decimals) if math.isfinite(value) else str(value)
    return str(value)


def format_value(value: Any, unit: Unit, decimals: int | None = None) -> str:
    """One cell's text. ``None`` is ``-`` (``NULL`` for ``raw``). ``decimals``: the column's
    (``render_table`` fixes them per column for ``number`` and ``raw`` floats)."""
    if unit == "raw":
        return _raw(value, 4 if decimals is None else decimals)
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    match unit:
        case "duration":
            return format_duration(float(value))
        case "hours":
            # Small amounts keep two decimals so that 0.04 GPU-h does not read as zero.
            return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"
        case "count":
            return str(int(value))
        case "number":
            if not isinstance(value, float):
                return f"{value:,}"
            return format_number(value) if decimals is None else _fixed(value, decimals)
        case _:
            return str(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def layout(
    headers: Sequence[str],
    body: Sequence[Sequence[str]],
    right: Sequence[bool],
    groups: Sequence[tuple[str, int]] | None = None,
) -> str:
    """Align cells under headers; ``groups`` adds a line of labels spanning column runs."""
    widths = [len(h) for h in headers]
    for cells in body:
        for i, cell in enumerate(cells):
            widths[i] = max(widths[i], len(cell))
    gap = "  "
    lines: list[str] = []
    if groups:
        spans: list[str] = []
        first = 0
        for label, count in groups:
            cols = range(first, first + count)
            span = sum(widths[i] for i in cols) + len(gap) * (count - 1)
            if label and len(label) + 2 > span:  # widen the group's last column to fit
                widths[first + count - 1] += len(label) + 2 - span
                span = len(label) + 2
            spans.append(f" {label} ".center(span, "-") if label else " " * span)
            first += count
        lines.append(gap.join(spans).rstrip())

    def row(cells: Sequence[str]) -> str:
        return gap.join(
            cell.rjust(widths[i]) if right[i] else cell.ljust(widths[i])
            for i, cell in enumerate(cells)
        ).rstrip()

    lines.append(row(headers))
    lines.append(gap.join("-" * w for w in widths))
    lines.extend(row(cells) for cells in body)
    return "\n".join(lines)


def render_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str | Column]) -> str:
    """Render rows (dicts) as an aligned plain-text table.

    ``columns`` are row keys or ``Column`` specs. Numbers are right-aligned; durations
    (keys ending in ``_s``, or ``unit="duration"``) are shown in human units.
    """
    cols = [c if isinstance(c, Column) else Column(c) for c in columns]
    body: list[list[str]] = []
    right = [c.unit in _NUMERIC_UNITS for c in cols]
    decimals: list[int | None] = []  # one number of decimals per column of floats
    for c in cols:
        values = [r.get(c.key) for r in rows]
        if c.unit == "raw":
            decimals.append(raw_decimals(values))
        elif c.unit in ("number", "auto") and any(isinstance(v, float) for v in values):
            decimals.append(number_decimals(values))
        else:
            decimals.append(None)
    for r in rows:
        cells = []
        for i, c in enumerate(cols):
            value = r.get(c.key)
            unit = resolve_unit(c, value)
            if unit in _NUMERIC_UNITS or (unit == "raw" and _is_number(value)):
                right[i] = True
            fixed = decimals[i] if unit in ("number", "raw") else None
            cells.append(format_value(value, unit, fixed))
        body.append(cells)
    return layout([c.title for c in cols], body, right)
