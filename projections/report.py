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
from typing import Any

from events.ledgertime import format_at, format_duration, is_wall_clock, parse_duration_ms
from projections.projector import connect
from projections.views import HANDFUL, JOB_AGGREGATES, SLO_RATIO, WAIT_THRESHOLD_S
from scheduler.render.table import (
    Column,
    format_value,
    layout,
    render_table,
    resolve_unit,
)

__all__ = [
    "ALL",
    "AUDIT_COLUMNS",
    "COMPARE_COLUMNS",
    "REPORT_COLUMNS",
    "SLO_COLUMNS",
    "USAGE_COLUMNS",
    "WEEKLY_COLUMNS",
    "compare_reports",
    "format_duration",
    "full_report",
    "parse_window",
    "render_full_report",
    "tenant_report",
]

ALL = "all"
"""The ``queue`` (and ``queue_path``) of the row that aggregates every queue."""

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
            cells += [format_value(r.get(c.key), resolve_unit(c, r.get(c.key))) for c in per_run]
        body.append(cells)
    return layout(headers, body, right, groups) + "\n\n" + _LEGEND


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
