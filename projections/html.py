"""``gpuledger report --format html``: one self-contained page with inline SVG plots.

No JavaScript, no stylesheet or font from the network: the page must open from a file on
an air-gapped machine and render the same in any browser. Every name that reaches the page
(queues, jobs, rules) comes from the ledger, i.e. from users, so every one of them goes
through ``esc`` — a queue called ``<script>`` renders as text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from events.ledgertime import format_at
from projections.report import (
    AUDIT_COLUMNS,
    REPORT_COLUMNS,
    SLO_COLUMNS,
    USAGE_COLUMNS,
    WEEKLY_COLUMNS,
    format_duration,
    readable_moments,
    window_text,
)
from projections.views import HANDFUL, SLO_RATIO, WAIT_THRESHOLD_S
from scheduler.render.svg import bar_chart, esc, line_chart
from scheduler.render.table import Column, format_value

__all__ = ["render_html"]


def _table(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column]) -> str:
    if not rows:
        return "<p><em>none</em></p>"
    head = "".join(f"<th>{esc(c.title)}</th>" for c in columns)
    body = []
    for r in rows:
        cells = []
        for c in columns:
            value = r.get(c.key)
            unit = c.unit if c.unit != "auto" else "text"
            text = format_value(value, unit)
            cls = ' class="num"' if unit in ("count", "number", "duration", "hours") else ""
            cells.append(f"<td{cls}>{esc(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


_STYLE = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;background:#fafafa}
h1{font-size:20px}h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;font-size:12px;background:#fff}
th,td{border:1px solid #ccc;padding:3px 8px}th{background:#eef}td.num{text-align:right}
svg{display:block;margin:8px 0;border:1px solid #ddd}
"""


def _percentile_bars(heading: str, tenants: Sequence[Mapping[str, Any]], figure: str) -> str:
    """Bars of ``figure``'s p50, p90 and p99 (columns ``p50_<figure>_s``, ...) per tenant."""
    bars = {p: [r[f"{p}_{figure}_s"] for r in tenants] for p in ("p50", "p90", "p99")}
    return bar_chart(heading, [str(r["queue_path"]) for r in tenants], bars, y_format="duration")


def render_html(report: Mapping[str, Any], *, title: str = "gpuledger report") -> str:
    """The whole page for a ``projections.report.full_report`` result."""
    window = report["window"]
    tenants = list(report["tenants"])  # the queues, then the ``all`` row
    percentile_bars = _percentile_bars("Completion percentiles per tenant", tenants, "completion")
    ttr_bars = _percentile_bars("Time-to-ready percentiles per tenant", tenants, "ttr")
    series = report["series"]
    allocation = line_chart(
        "Allocation over time",
        {q: [(p["at_s"], p["allocated"]) for p in pts] for q, pts in series.items()},
        y_label="GPUs",
    )
    depth = line_chart(
        "Queue depth over time",
        {q: [(p["at_s"], p["pending"]) for p in pts] for q, pts in series.items()},
        y_label="pending jobs",
    )
    wall = bool(window.get("wall"))

    def week_label(week: int) -> str:
        return format_at(week * 604_800_000, wall=True)[:10] if wall else f"week {week}"

    weekly = report["preemptions_weekly"]
    weeks = sorted({int(r["week"]) for r in weekly})
    by_queue: dict[str, dict[int, float]] = {}
    for r in weekly:
        by_queue.setdefault(str(r["queue_path"]), {})[int(r["week"])] = float(r["preemptions"])
    preemption_bars = bar_chart(
        "Preemptions per week",
        [week_label(w) for w in weeks],
        {q: [counts.get(w, 0.0) for w in weeks] for q, counts in sorted(by_queue.items())},
    )
    span = (
        "all history"
        if window["window_s"] is None
        else f"the last {format_duration(window['window_s'])}"
    )
    body = [
        f"<h1>{esc(title)}</h1>",
        f"<p>Ledger time {esc(window_text(window))} ({esc(span)}).</p>",
        "<h2>Per-tenant percentiles</h2>",
        percentile_bars,
        ttr_bars,
        _table(report["tenants"], REPORT_COLUMNS),
        f"<h2>Fairness SLO (p90 within {SLO_RATIO:g}&times; p50, rolling 24 h)</h2>",
        _table(*readable_moments(report["slo"], SLO_COLUMNS, wall)),
        "<h2>Queue depth and allocation</h2>",
        allocation,
        depth,
        f"<h2>Preemptions (more than a handful: &gt; {HANDFUL} per week)</h2>",
        preemption_bars,
        _table(*readable_moments(weekly, WEEKLY_COLUMNS, wall)),
        "<h2>Preemption audit</h2>",
        _table(*readable_moments(report["preemption_audit"], AUDIT_COLUMNS, wall)),
        "<h2>GPU-hours: allocated, idle, utilised</h2>",
        _table(report["usage"], USAGE_COLUMNS),
        f"<h2>GPUs requested but not allocated within {WAIT_THRESHOLD_S // 60} min</h2>",
        _table(
            report["waits"],
            (
                Column("job", unit="text"),
                Column("queue_path", "queue", "text"),
                Column("gpus", unit="number"),
                Column("waited_s", "waited", "duration"),
                Column("ran_without_gpus", "ran without GPUs", "text"),
                Column("unschedulable_reason", "reason", "text"),
            ),
        ),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{esc(title)}</title><style>{_STYLE}</style></head><body>"
        + "\n".join(body)
        + "</body></html>\n"
    )
