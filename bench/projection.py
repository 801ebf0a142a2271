"""Projection benchmark: a million ledger events into DuckDB, then the report's queries.

``rows(ledger)`` projects the first ``TARGET`` events of the month-scale simulator ledger
of ``bench.__main__`` (about 1.1 million records; ``--quick`` has a tenth) into a fresh
DuckDB file, projects it again (nothing to do), and times the percentile, SLO, preemption
and GPU-usage queries, then the console's pages and API over it (``bench.console``).
Figures go into the bench table with their targets.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from events.memlog import MemoryLedger
from projections.projector import connect, project

TARGET = 1_000_000
"""Events the benchmark projects (at least)."""
EVENTS_PER_S_TARGET = 100_000
QUERY_MS_TARGET = 1_000

QUERIES: dict[str, str] = {
    "tenant_percentiles": "SELECT * FROM tenant_percentiles",
    "tree_percentiles (24 h window)": (
        "SELECT * FROM tree_percentiles_between("
        "(SELECT max(at_s) FROM events) - 86400, CAST('infinity' AS DOUBLE))"
    ),
    "fairness_slo": "SELECT count(*), count(*) FILTER (WHERE slo_breach) FROM fairness_slo",
    "preemptions_weekly": "SELECT * FROM preemptions_weekly",
    "gpu_usage": "SELECT sum(allocated_gpu_hours), sum(idle_gpu_hours) FROM gpu_usage",
}


def rows(ledger: MemoryLedger, *, target: int = TARGET) -> list[dict[str, Any]]:
    """Bench rows for projecting ``ledger`` (its first ``target`` events, if it has more)."""
    reader = ledger
    if len(ledger.records) > target:
        reader = MemoryLedger(ledger.records[:target], name="bench")
    events = reader.end_offset()
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gpuledger-bench-") as tmp:
        db = Path(tmp) / "bench.duckdb"
        stats = project(reader, db)
        rate = stats.events_read / stats.seconds
        size_mb = db.stat().st_size / 1e6
        out.append(
            {
                "benchmark": f"project {events:,} ledger events into DuckDB",
                "figure": f"{rate:,.0f} events/s",
                "target": f">= {EVENTS_PER_S_TARGET:,} events/s",
                "ratio": rate / EVENTS_PER_S_TARGET,
                "fifo": "",
                "detail": f"{stats.seconds:.1f} s, {stats.rows_written:,} rows, {size_mb:.0f} MB",
            }
        )
        again = project(reader, db)
        out.append(
            {
                "benchmark": "re-project the same ledger (nothing new)",
                "figure": f"{again.seconds * 1000:.0f} ms",
                "target": "<= 1,000 ms",
                "ratio": 1.0 / max(again.seconds, 1e-9),
                "fifo": "",
                "detail": f"{again.events_read} events read",
            }
        )
        con = connect(db, read_only=True)
        try:
            for name, sql in QUERIES.items():
                con.execute(sql).fetchall()  # warm: the first query loads the columns
                started = time.perf_counter()
                result = con.execute(sql).fetchall()
                ms = (time.perf_counter() - started) * 1000
                out.append(
                    {
                        "benchmark": f"query {name}",
                        "figure": f"{ms:,.0f} ms",
                        "target": f"<= {QUERY_MS_TARGET:,} ms",
                        "ratio": QUERY_MS_TARGET / max(ms, 1e-6),
                        "fifo": "",
                        "detail": f"{len(result)} rows",
                    }
                )
        finally:
            con.close()
        from bench.console import rows as console_rows  # noqa: PLC0415

        out += console_rows(reader, db)  # gpuledger serve over the same projection
    return out
