"""Projection benchmark: a million ledger events into DuckDB, then the report's queries.

``rows(ledger)`` projects the first ``TARGET`` events of the month-scale simulator ledger
of ``bench.__main__`` (about 1.1 million records; ``--quick`` has a tenth) into a fresh
DuckDB file, projects it again (nothing to do), and times the percentile, SLO, preemption
and GPU-usage queries, then the console's pages and API over it (``bench.console``);
``long_rows()`` projects a quiet 4,000-hour, 22-queue ledger. Each projection is printed
with its rows and bytes per event and beside its physical floor (``floor_rate``: the same
records decoded and appended to Arrow columns, nothing folded).
Figures go into the bench table with their targets.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa

from events.codec import UnknownEventType, decode_event
from events.memlog import MemoryLedger
from events.port import LedgerReader
from projections.projector import connect, project
from replay.config import ClusterFile, QueuesFile, WorkloadFile, parse
from replay.sim import Simulation

TARGET = 1_000_000
"""Events the benchmark projects (at least)."""
EVENTS_PER_S_TARGET = 300_000
QUERY_MS_TARGET = 1_000

LONG_HOURS = 4_000
LONG_LEAVES = 22
LONG_CLUSTER = "nodes:\n  - {name: n, count: 8, gpus: 8}\n"
LONG_QUEUES = "queues:\n" + "".join(
    f"  - {{name: team{i:02d}, deserved_percent: {100 // LONG_LEAVES}}}\n"
    for i in range(LONG_LEAVES)
)
LONG_WORKLOAD = f"""seed: 7
horizon_s: {LONG_HOURS * 3600}
generators:
""" + "".join(
    f"  - {{name: g{i:02d}, queue: team{i:02d}, arrival: {{type: poisson, rate_per_h: 0.0034}},"
    " gang_size: {type: choice, values: [1, 2]}, gpus_per_pod: {type: choice, values: [1, 4]},"
    " runtime_s: {type: lognormal, median: 3600, sigma: 1.0, max: 172800}}\n"
    for i in range(LONG_LEAVES)
)
"""A quiet, long ledger: about 300 jobs over 4,000 hours in 22 leaf queues, the shape that
made a per-minute ``queue_shares`` write millions of rows."""


def long_ledger() -> MemoryLedger:
    """The 4,000-hour, 22-queue ledger, simulated under the gpuledger policy."""
    ledger = MemoryLedger(name="long")
    Simulation(
        parse(LONG_CLUSTER, ClusterFile),
        parse(LONG_QUEUES, QueuesFile),
        parse(LONG_WORKLOAD, WorkloadFile),
        "gpuledger",
        ledger,
    ).run()
    return ledger


def table_rows(db: Path) -> dict[str, int]:
    """Rows of every projection table."""
    con = connect(db, read_only=True)
    try:
        tables = [
            str(r[0])
            for r in con.execute(
                "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' ORDER BY 1"
            ).fetchall()
        ]
        counts = {}
        for t in tables:
            row = con.execute(f'SELECT count(*) FROM "{t}"').fetchone()  # catalogue names
            counts[t] = int(row[0]) if row is not None else 0
        return counts
    finally:
        con.close()


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


def floor_rate(reader: LedgerReader, batch: int = 50_000) -> float:
    """Events/s of the work no projection can skip: decode each record's event (msgspec),
    encode its JSON payload for ``events`` and append it to Arrow columns — no fold."""
    encode = msgspec.json.Encoder().encode
    started = time.perf_counter()
    offsets: list[int] = []
    ats: list[int] = []
    types: list[str] = []
    payloads: list[bytes] = []
    count = 0
    for offset, env in reader.read(0, reader.end_offset()):
        try:
            event: Any = decode_event(env, offset)
        except UnknownEventType:
            event = msgspec.msgpack.decode(env.payload)
        offsets.append(offset)
        ats.append(env.at)
        types.append(env.type)
        payloads.append(encode(event))
        count += 1
        if len(offsets) == batch:
            _arrow(offsets, ats, types, payloads)
            offsets, ats, types, payloads = [], [], [], []
    _arrow(offsets, ats, types, payloads)
    return count / (time.perf_counter() - started)


def _arrow(offsets: list[int], ats: list[int], types: list[str], payloads: list[bytes]) -> None:
    pa.table(
        [
            pa.array(offsets, pa.int64()),
            pa.array(ats, pa.int64()),
            pa.array(types, pa.string()),
            pa.array(payloads, pa.binary()).cast(pa.string()),
        ],
        names=["offset", "at_ms", "type", "payload"],
    )


def _projection_row(title: str, reader: LedgerReader, db: Path) -> dict[str, Any]:
    """Project ``reader`` into ``db``; the row: rate, rows and bytes per event, floor."""
    events = reader.end_offset()
    stats = project(reader, db)
    rate = stats.events_read / stats.seconds
    floor = floor_rate(reader)
    rows = sum(table_rows(db).values())
    size = db.stat().st_size
    return {
        "benchmark": f"project {title} ({events:,} events)",
        "figure": f"{rate:,.0f} events/s",
        "target": f">= {EVENTS_PER_S_TARGET:,} events/s",
        "ratio": rate / EVENTS_PER_S_TARGET,
        "fifo": "",
        "detail": (
            f"{stats.seconds:.1f} s; {rows:,} rows ({rows / events:.2f}/event), "
            f"{size / 1e6:.0f} MB ({size / events:,.0f} B/event); floor (decode + Arrow, "
            f"no fold) {floor:,.0f} events/s, projection at {rate / floor:.2f}x of it"
        ),
    }


def long_rows() -> list[dict[str, Any]]:
    """Bench row for projecting the quiet 4,000-hour, 22-queue ledger."""
    with tempfile.TemporaryDirectory(prefix="gpuledger-bench-") as tmp:
        return [
            _projection_row(
                f"the {LONG_HOURS:,}-hour, {LONG_LEAVES}-queue ledger",
                long_ledger(),
                Path(tmp) / "long.duckdb",
            )
        ]


def rows(ledger: MemoryLedger, *, target: int = TARGET) -> list[dict[str, Any]]:
    """Bench rows for projecting ``ledger`` (its first ``target`` events, if it has more)."""
    reader = ledger
    if len(ledger.records) > target:
        reader = MemoryLedger(ledger.records[:target], name="bench")
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gpuledger-bench-") as tmp:
        db = Path(tmp) / "bench.duckdb"
        out.append(_projection_row("the month-scale ledger", reader, db))
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
