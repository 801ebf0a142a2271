"""Per-tenant reports over a projection database, as plain-text tables.

``tenant_report`` reads the ``tenant_percentiles`` view (plus an ``all`` row from
``overall_percentiles``); ``render_table`` aligns rows into a table with human units;
``compare_reports`` puts several runs of the same workload (one database per scheduling
policy) side by side, which is what ``gpuledger demo`` prints for ``gpuledger`` vs ``fifo``.
No dependencies beyond DuckDB: the output must render the same on any terminal.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from projections.projector import connect

__all__ = [
    "ALL",
    "COMPARE_COLUMNS",
    "REPORT_COLUMNS",
    "Column",
    "Unit",
    "compare_reports",
    "format_duration",
    "format_value",
    "render_table",
    "tenant_report",
]

ALL = "all"
"""The ``queue`` (and ``queue_path``) of the row that aggregates every queue."""

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


REPORT_COLUMNS: tuple[Column, ...] = (
    Column("queue_path", "queue", "text"),
    Column("jobs", unit="count"),
    Column("ready", unit="count"),
    Column("finished", unit="count"),
    Column("active", unit="count"),
    Column("p50_ttr_s", "p50 TTR", "duration"),
    Column("p90_ttr_s", "p90 TTR", "duration"),
    Column("p99_ttr_s", "p99 TTR", "duration"),
    Column("p50_completion_s", "p50 done", "duration"),
    Column("p90_completion_s", "p90 done", "duration"),
    Column("p99_completion_s", "p99 done", "duration"),
    Column("preemptions", "preempt", "count"),
    Column("lost_gpu_hours", "lost GPU-h", "hours"),
)
"""The columns ``gpuledger report`` shows."""

COMPARE_COLUMNS: tuple[Column, ...] = (
    Column("ready", unit="count"),
    Column("p50_ttr_s", "p50 TTR", "duration"),
    Column("p90_ttr_s", "p90 TTR", "duration"),
    Column("p99_ttr_s", "p99 TTR", "duration"),
    Column("p90_completion_s", "p90 done", "duration"),
    Column("preemptions", "preempt", "count"),
    Column("lost_gpu_hours", "lost GPU-h", "hours"),
)
"""The columns ``compare_reports`` shows for each policy."""

_LEGEND = """\
TTR         time to ready: submission until the whole gang first ran
done        completion: submission until every pod finished (succeeded or failed jobs)
preempt     preemptions suffered; lost GPU-h: GPU hours of work they threw away
-           no data (no job of the queue got that far)"""

_TOTAL = "\x00all"  # by_queue key of the ``all`` row: no queue name contains NUL

_NUMERIC_UNITS = frozenset({"count", "number", "duration", "hours"})


# --------------------------------------------------------------------------- formatting


def format_duration(seconds: float | None) -> str:
    """Seconds in the largest unit that keeps them readable: 850ms, 12.3s, 4.1m, 2.0h, 3.5d."""
    if seconds is None:
        return "-"
    sign = "-" if seconds < 0 else ""
    s = abs(seconds)
    # Compare the ROUNDED value with each limit, so 59.97 s shows as 1.0m, not 60.0s.
    if round(s * 1000) < 1000:
        return f"{sign}{s * 1000:.0f}ms"
    for divisor, suffix, limit in ((1, "s", 60), (60, "m", 60), (3600, "h", 24)):
        if round(s / divisor, 1) < limit:
            return f"{sign}{s / divisor:.1f}{suffix}"
    return f"{sign}{s / 86400:.1f}d"


def _resolve(column: Column, value: Any) -> Unit:
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


def format_value(value: Any, unit: Unit) -> str:
    """One cell's text. ``None`` is ``-`` (``NULL`` for ``raw``)."""
    if unit == "raw":
        return "NULL" if value is None else str(value)
    if value is None:
        return "-"
    match unit:
        case "duration":
            return format_duration(float(value))
        case "hours":
            # Small amounts keep two decimals so that 0.04 GPU-h does not read as zero.
            return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"
        case "count":
            return str(int(value))
        case "number":
            return f"{value:.4g}" if isinstance(value, float) else str(value)
        case _:
            return str(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _layout(
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
    for r in rows:
        cells = []
        for i, c in enumerate(cols):
            value = r.get(c.key)
            unit = _resolve(c, value)
            if unit in _NUMERIC_UNITS or (unit == "raw" and _is_number(value)):
                right[i] = True
            cells.append(format_value(value, unit))
        body.append(cells)
    return _layout([c.title for c in cols], body, right)


# --------------------------------------------------------------------------- reports


def tenant_report(db_path: str | os.PathLike[str], *, total: bool = True) -> list[dict[str, Any]]:
    """Rows of ``tenant_percentiles`` ordered by queue path, then (``total``) an ``all`` row.

    Raises ``FileNotFoundError`` for a missing database and ``SchemaError`` for a file
    that is not a projection.
    """
    con = connect(db_path, read_only=True)
    try:
        cur = con.execute("SELECT * FROM tenant_percentiles ORDER BY queue_path, queue")
        names = [d[0] for d in cur.description]
        rows = [dict(zip(names, values, strict=True)) for values in cur.fetchall()]
        if total:
            cur = con.execute("SELECT * FROM overall_percentiles")
            names = [d[0] for d in cur.description]
            values = cur.fetchone()
            assert values is not None  # an aggregate without GROUP BY always has a row
            rows.append({"queue": ALL, "queue_path": ALL, **dict(zip(names, values, strict=True))})
    finally:
        con.close()
    return rows


def compare_reports(
    named: Mapping[str, str | os.PathLike[str]],
    columns: Sequence[Column] = COMPARE_COLUMNS,
) -> str:
    """Side-by-side per-tenant table of several runs (name → projection database).

    One row per queue found in any run, then the ``all`` row; for each run, ``columns``
    under a header with the run's name. ``jobs`` is shown once when every run has the same
    number of jobs per queue (the same workload), else once per run.
    """
    if not named:
        raise ValueError("compare_reports needs at least one projection database")
    reports = {name: tenant_report(path) for name, path in named.items()}
    by_queue: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in reports}
    paths: dict[str, str] = {_TOTAL: ALL}
    for name, rows in reports.items():
        # The last row of a report is its ``all`` row; a sentinel key keeps it apart from a
        # queue that happens to be called "all".
        for r in rows[:-1]:
            by_queue[name][str(r["queue"])] = r
            paths.setdefault(str(r["queue"]), str(r["queue_path"]))
        by_queue[name][_TOTAL] = rows[-1]
    order = [*sorted((k for k in paths if k != _TOTAL), key=lambda k: (paths[k], k)), _TOTAL]

    jobs_once = all(
        len({by_queue[name].get(k, {}).get("jobs") for name in reports}) == 1 for k in order
    )
    per_run = ([] if jobs_once else [Column("jobs", unit="count")]) + list(columns)
    headers = ["queue"] + (["jobs"] if jobs_once else [])
    right = [False] + ([True] if jobs_once else [])
    groups: list[tuple[str, int]] = [("", len(headers))]
    for name in reports:
        headers += [c.title for c in per_run]
        right += [True] * len(per_run)
        groups.append((name, len(per_run)))

    body: list[list[str]] = []
    for k in order:
        first = next(by_queue[name][k] for name in reports if k in by_queue[name])
        cells = [paths[k]]
        if jobs_once:
            cells.append(format_value(first.get("jobs"), "count"))
        for name in reports:
            r = by_queue[name].get(k, {})
            cells += [format_value(r.get(c.key), _resolve(c, r.get(c.key))) for c in per_run]
        body.append(cells)
    return _layout(headers, body, right, groups) + "\n\n" + _LEGEND
