"""Per-tenant reports over a projection database, as plain-text tables.

``tenant_report`` reads the ``tenant_percentiles`` view (plus an ``all`` row from
``overall_percentiles``); ``render_table`` aligns rows into a table with human units;
``compare_reports`` puts several runs of the same workload (one database per scheduling
policy) side by side, which is what ``gpuledger demo`` prints for ``gpuledger`` vs ``fifo``.
No dependencies beyond DuckDB: the output must render the same on any terminal.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from events.ledgertime import format_at, format_duration, is_wall_clock, parse_duration_ms
from projections.projector import connect
from projections.views import HANDFUL, JOB_AGGREGATES, SLO_RATIO, WAIT_THRESHOLD_S

__all__ = [
    "ALL",
    "AUDIT_COLUMNS",
    "COMPARE_COLUMNS",
    "REPORT_COLUMNS",
    "SLO_COLUMNS",
    "USAGE_COLUMNS",
    "WEEKLY_COLUMNS",
    "Column",
    "Unit",
    "compare_reports",
    "format_duration",
    "format_number",
    "format_value",
    "full_report",
    "parse_window",
    "render_full_report",
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
            unit = _resolve(c, value)
            if unit in _NUMERIC_UNITS or (unit == "raw" and _is_number(value)):
                right[i] = True
            fixed = decimals[i] if unit in ("number", "raw") else None
            cells.append(format_value(value, unit, fixed))
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


# --------------------------------------------------------------------------- the full report

SLO_COLUMNS: tuple[Column, ...] = (
    Column("queue_path", "queue", "text"),
    Column("windows", unit="count"),
    Column("evaluated", unit="count"),
    Column("breached", unit="count"),
    Column("noisy", unit="count"),
    Column("worst_ratio", "worst p90/p50", "number"),
    Column("last_breach_end_s", "last breach ends", "duration"),
)
"""The fairness-SLO section of ``gpuledger report`` (24 h windows, p90 ≤ 1.5 × p50): the
windows, those with enough completions to judge (evaluated), and of those the breached,
as the console's Tenants page shows them."""

WEEKLY_COLUMNS: tuple[Column, ...] = (
    Column("queue_path", "queue", "text"),
    Column("week", unit="count"),
    Column("preemptions", "all", "count"),
    Column("reclaims", "reclaim", "count"),
    Column("preempts", "preempt", "count"),
    Column("backfills", "backfill", "count"),
    Column("other_rules", "other", "count"),
    Column("preemptor_queues", "by queues", "text"),
    Column("lost_gpu_hours", "lost GPU-h", "hours"),
    Column("more_than_a_handful", "> handful", "text"),
)
"""The weekly preemption section."""

AUDIT_COLUMNS: tuple[Column, ...] = (
    Column("at_s", "at", "duration"),
    Column("job", "victim", "text"),
    Column("queue", "victim queue", "text"),
    Column("preemptor", unit="text"),
    Column("preemptor_queue", "preemptor queue", "text"),
    Column("rule", unit="text"),
    Column("lost_gpu_hours", "lost GPU-h", "hours"),
)
"""The preemption audit: the costliest preemptions, with who caused them."""

USAGE_COLUMNS: tuple[Column, ...] = (
    Column("queue_path", "queue", "text"),
    Column("allocated_gpu_hours", "allocated GPU-h", "hours"),
    Column("running_gpu_hours", "running GPU-h", "hours"),
    Column("idle_gpu_hours", "idle GPU-h", "hours"),
    Column("utilised_gpu_hours", "utilised GPU-h", "hours"),
    Column("drift_gpu_hours", "drift GPU-h", "hours"),
)
"""GPU-hours per queue: held, running, held idle, and measured by monitoring samples."""

AUDIT_LIMIT = 20
"""Preemptions listed in the audit (the costliest first)."""
SERIES_POINTS = 240
"""At most this many points per queue in the time-series plots (minutes are averaged)."""


def _fetch(con: Any, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    cur = con.execute(sql, list(params))
    names = [d[0] for d in cur.description]
    return [dict(zip(names, values, strict=True)) for values in cur.fetchall()]


def parse_window(text: str) -> float:
    """``90s``, ``30m``, ``24h``, ``7d``, ``1h30m`` or plain seconds → seconds
    (``events.ledgertime.parse_duration_ms``; ``ValueError`` else)."""
    try:
        ms = parse_duration_ms(text)
    except ValueError:
        raise ValueError(f"bad window {text!r}: use e.g. 90s, 30m, 24h or 7d") from None
    if not ms > 0:
        raise ValueError(f"bad window {text!r}: must be positive")
    return ms / 1000


def full_report(con: Any, window_s: float | None = None) -> dict[str, Any]:
    """Every section of ``gpuledger report`` from an open projection (or Parquet) connection.

    ``window_s`` limits the report to the last ``window_s`` seconds of ledger time: jobs
    submitted, SLO windows ending, preemptions and GPU usage within it. Keys: ``window``,
    ``tenants`` (with the ``all`` row last), ``tree``, ``slo``, ``slo_breaches``,
    ``preemptions_weekly``, ``preemption_audit``, ``usage``, ``waits`` and ``series``.
    """
    row = con.execute("SELECT min(at_ms), max(at_ms) FROM events").fetchone()
    first_s = (row[0] or 0) / 1000
    end_s = (row[1] or 0) / 1000
    start_s = end_s - window_s if window_s is not None else float("-inf")
    lo, hi = start_s, float("inf")
    tenants = _fetch(
        con,
        "SELECT * FROM tenant_percentiles_between(?, ?) ORDER BY queue_path, queue",
        [lo, hi],
    )
    overall = _fetch(
        con,
        f"SELECT {JOB_AGGREGATES} FROM jobs WHERE submitted_at_s >= ?",  # noqa: S608  # constant
        [lo],
    )
    tenants.append({"queue": ALL, "queue_path": ALL, **overall[0]})
    slo = _fetch(
        con,
        "SELECT queue, queue_path, count(*) AS windows, "
        "count(*) FILTER (WHERE slo_breach IS NOT NULL) AS evaluated, "
        "count(*) FILTER (WHERE slo_breach) AS breached, "
        "count(*) FILTER (WHERE noisy_neighbour) AS noisy, "
        "max(ratio) FILTER (WHERE slo_breach IS NOT NULL) AS worst_ratio, "
        "max(window_end_s) FILTER (WHERE slo_breach) AS last_breach_end_s "
        "FROM fairness_slo WHERE window_end_s > ? GROUP BY ALL ORDER BY queue_path, queue",
        [lo],
    )
    breaches = _fetch(
        con,
        "SELECT * FROM fairness_slo WHERE slo_breach AND window_end_s > ? "
        "ORDER BY ratio DESC, queue, window_end_s LIMIT 50",
        [lo],
    )
    weekly = _fetch(
        con,
        "SELECT p.queue, coalesce(q.path, p.queue) AS queue_path, p.at_ms // 604800000 AS week, "  # noqa: S608  # HANDFUL is a constant
        "count(*) AS preemptions, count(*) FILTER (WHERE rule = 'reclaim') AS reclaims, "
        "count(*) FILTER (WHERE rule = 'preempt') AS preempts, "
        "count(*) FILTER (WHERE rule = 'backfill') AS backfills, "
        "count(*) FILTER (WHERE rule NOT IN ('reclaim', 'preempt', 'backfill')) AS other_rules, "
        "string_agg(DISTINCT preemptor_queue, ',' ORDER BY preemptor_queue) AS preemptor_queues, "
        "sum(lost_gpu_ms) / 3600000 AS lost_gpu_hours, "
        f"count(*) > {HANDFUL} AS more_than_a_handful "
        "FROM preemptions p LEFT JOIN queues q ON q.queue = p.queue WHERE p.at_s >= ? "
        "GROUP BY ALL ORDER BY week, queue_path",
        [lo],
    )
    audit = _fetch(
        con,
        "SELECT at_s, job, queue, preemptor, preemptor_queue, rule, "
        "lost_gpu_ms / 3600000 AS lost_gpu_hours FROM preemptions WHERE at_s >= ? "
        'ORDER BY lost_gpu_ms DESC, "offset" LIMIT ?',
        [lo, AUDIT_LIMIT],
    )
    usage = _fetch(
        con,
        "SELECT queue, queue_path, sum(allocated_gpu_hours) AS allocated_gpu_hours, "
        "sum(running_gpu_hours) AS running_gpu_hours, sum(idle_gpu_hours) AS idle_gpu_hours, "
        "sum(sampled_gpu_hours) AS sampled_gpu_hours, "
        "sum(utilised_gpu_hours) AS utilised_gpu_hours, sum(drift_gpu_hours) AS drift_gpu_hours "
        "FROM gpu_usage WHERE bucket_start_s + bucket_s > ? GROUP BY ALL ORDER BY queue_path",
        [lo],
    )
    waits = _fetch(
        con,
        "SELECT * FROM requested_not_allocated WHERE submitted_at_s >= ? "
        "ORDER BY waited_s DESC, job LIMIT 50",
        [lo],
    )
    return {
        "window": {
            "start_s": max(start_s, first_s),
            "end_s": end_s,
            "window_s": window_s,
            "wall": is_wall_clock(row[0]),
        },
        "tenants": tenants,
        "tree": _fetch(
            con, "SELECT * FROM tree_percentiles_between(?, ?) ORDER BY tree_path", [lo, hi]
        ),
        "slo": slo,
        "slo_breaches": breaches,
        "preemptions_weekly": weekly,
        "preemption_audit": audit,
        "usage": usage,
        "waits": waits,
        "series": _series(con, lo),
    }


def _series(con: Any, lo: float) -> dict[str, list[dict[str, Any]]]:
    """Leaf queues' allocation, fair share and depth over time: time-weighted averages
    over at most SERIES_POINTS equal buckets of whole minutes, from the intervals."""
    row = con.execute(
        "SELECT min(greatest(from_minute, ceil(? / 60))), max(to_minute) FROM queue_shares "
        "WHERE to_minute * 60.0 > ?",
        [lo, lo],
    ).fetchone()
    if row is None or row[0] is None:
        return {}
    first, end = int(row[0]), int(row[1])
    step = max(1, -(-(end - first) // SERIES_POINTS))
    points = _fetch(
        con,
        "WITH buckets AS ("
        "  SELECT b AS bucket, ? + b * ? AS lo, ? + (b + 1) * ? AS hi"
        "  FROM range(0, ?) t(b)"
        "), parts AS ("
        "  SELECT s.queue, k.bucket,"
        "         least(s.to_minute, k.hi) - greatest(s.from_minute, k.lo) AS minutes,"
        "         s.allocated_gpus, s.fair_gpus, s.pending_jobs"
        "  FROM queue_shares s JOIN buckets k"
        "    ON s.from_minute < k.hi AND s.to_minute > k.lo"
        "  WHERE s.queue NOT IN (SELECT DISTINCT parent FROM queue_shares)"
        ")"
        "SELECT queue, (? + bucket * ?) * 60 AS at_s,"
        "       sum(minutes * allocated_gpus) / sum(minutes) AS allocated,"
        "       sum(minutes * fair_gpus) / sum(minutes) AS fair,"
        "       sum(minutes * pending_jobs) / sum(minutes) AS pending "
        "FROM parts GROUP BY queue, bucket ORDER BY queue, at_s",
        [first, step, first, step, -(-(end - first) // step), first, step],
    )
    series: dict[str, list[dict[str, Any]]] = {}
    for p in points:
        series.setdefault(str(p.pop("queue")), []).append(p)
    return series


MOMENT_KEYS = frozenset({"at_s", "last_breach_end_s", "window_start_s", "window_end_s"})
"""Columns that are moments of ledger time (not durations): ISO timestamps on a live ledger."""


def readable_moments(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[Column], wall: bool
) -> tuple[list[dict[str, Any]], tuple[Column, ...]]:
    """On a wall-clock ledger, moments as ISO-8601 UTC and weeks as the date they start
    (``2026-11-26``) rather than seconds and weeks since 1970; else unchanged."""
    if not wall:
        return [dict(r) for r in rows], tuple(columns)
    cols = tuple(
        Column(c.key, c.header, "text") if c.key in MOMENT_KEYS or c.key == "week" else c
        for c in columns
    )
    out: list[dict[str, Any]] = []
    for row in rows:
        new = dict(row)
        for key in MOMENT_KEYS & new.keys():
            if new[key] is not None:
                new[key] = format_at(float(new[key]) * 1000, wall=True)
        if new.get("week") is not None:
            new["week"] = format_at(int(new["week"]) * 604_800_000, wall=True)[:10]
        out.append(new)
    return out, cols


def window_text(window: Mapping[str, Any]) -> str:
    """``+00:00:00 – +15:16:26`` (simulated) or ``2026-12-01T… – 2026-12-03T…`` (live)."""
    wall = bool(window.get("wall"))
    if not wall:
        return f"{format_duration(window['start_s'])} to {format_duration(window['end_s'])}"
    start = format_at(window["start_s"] * 1000, wall=True)
    return f"{start} to {format_at(window['end_s'] * 1000, wall=True)}"


def render_full_report(report: Mapping[str, Any]) -> str:
    """The plain-text form of ``full_report``: one titled table per section."""
    window = report["window"]
    wall = bool(window.get("wall"))
    span = (
        "all history"
        if window["window_s"] is None
        else f"last {format_duration(window['window_s'])}"
    )

    def table(key: str, columns: Sequence[Column]) -> str:
        return render_table(*readable_moments(report[key], columns, wall))

    parts = [
        f"Tenants ({span} of ledger time, jobs by submission"
        + (f"; {window_text(window)})" if wall else ")"),
        render_table(report["tenants"], REPORT_COLUMNS),
        "",
        f"Fairness SLO: p90 completion within {SLO_RATIO:g}x p50 over rolling 24 h windows",
        table("slo", SLO_COLUMNS) if report["slo"] else "(no completed jobs)",
        "",
        f"Preemptions per week (more than a handful = more than {HANDFUL})",
        table("preemptions_weekly", WEEKLY_COLUMNS) if report["preemptions_weekly"] else "(none)",
        "",
        "Preemption audit (costliest first)",
        table("preemption_audit", AUDIT_COLUMNS) if report["preemption_audit"] else "(none)",
        "",
        "GPU usage (idle = allocated but not running; drift = allocated but not utilised)",
        render_table(report["usage"], USAGE_COLUMNS) if report["usage"] else "(no allocations)",
        "",
        f"GPUs requested but not allocated within {WAIT_THRESHOLD_S // 60} min: "
        f"{len(report['waits'])} job(s)",
        "",
        _LEGEND,
    ]
    return "\n".join(parts)
