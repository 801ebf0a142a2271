"""``gpuledger export --parquet DIR``: the projection as Parquet files, partitioned by day.

Each time-stamped table becomes ``DIR/<table>/day=<N>/*.parquet`` (``N`` = days of ledger
time since 0, Hive-style, so Spark, Trino, DuckDB or pandas prune by day); the small
dimension tables (``queues``, ``pods``) are one file each. ``open_parquet`` attaches such a
directory to an in-memory DuckDB and creates the very same views and macros
(``projections.views``) over it, so every documented query runs unchanged on the lake.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import duckdb

from projections.projector import SCHEMA_VERSION, connect
from projections.views import JOB_AGGREGATES, SHARE_VIEW_DDL, VIEW_DDL

__all__ = ["PARTITIONED", "UNPARTITIONED", "export_parquet", "open_parquet"]

PARTITIONED: dict[str, str] = {
    "events": "at_ms",
    "jobs": "submitted_at_ms",
    "allocations": "from_ms",
    "preemptions": "at_ms",
    "gpu_utilization": "at_ms",
    "queue_shares": "from_ms",
}
"""Tables split by day, and the millisecond column that decides the day."""
UNPARTITIONED: tuple[str, ...] = ("queues", "pods")
"""Tables written as one file each."""

# Views of schema 1 that VIEW_DDL does not repeat.
_V1_VIEWS = (
    "tenant_percentiles AS SELECT queue, queue_path, {agg} FROM jobs GROUP BY queue, queue_path",
    "overall_percentiles AS SELECT {agg} FROM jobs",
)

_DAY_MS = 86_400_000


def _sql_path(path: Path) -> str:
    return str(path).replace("'", "''")


def export_parquet(db_path: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> int:
    """Write every table of the projection at ``db_path`` under ``out_dir``; return rows.

    The directory is replaced table by table (a table's old files are removed first), so a
    re-export after more projection never leaves stale days behind.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    con = connect(db_path, read_only=True)
    total = 0
    try:
        for table, column in PARTITIONED.items():
            target = out / table
            _clear(target)
            target.mkdir()
            count = _count(con, table)
            total += count
            if count == 0:
                # No day directories at all: keep the schema in one empty file.
                con.execute(
                    f"COPY (SELECT *, CAST(NULL AS BIGINT) AS day FROM {table} LIMIT 0) "  # noqa: S608  # constant table names
                    f"TO '{_sql_path(target / 'empty.parquet')}' (FORMAT parquet)"
                )
                continue
            con.execute(
                f"COPY (SELECT *, {column} // {_DAY_MS} AS day FROM {table}) "  # noqa: S608
                f"TO '{_sql_path(target)}' (FORMAT parquet, PARTITION_BY (day), "
                "OVERWRITE_OR_IGNORE)"
            )
        for table in UNPARTITIONED:
            target = out / table
            _clear(target)
            target.mkdir()
            total += _count(con, table)
            con.execute(f"COPY {table} TO '{_sql_path(target / 'data.parquet')}' (FORMAT parquet)")
    finally:
        con.close()
    manifest = {"schema_version": SCHEMA_VERSION, "tables": [*PARTITIONED, *UNPARTITIONED]}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return total


def _count(con: duckdb.DuckDBPyConnection, table: str) -> int:
    row = con.execute(f"SELECT count(*) FROM {table}").fetchone()  # noqa: S608  # constant
    return int(row[0]) if row is not None else 0


def _clear(target: Path) -> None:
    if not target.exists():
        return
    for path in sorted(target.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_dir():
            path.rmdir()
        else:
            path.unlink()
    target.rmdir()


def open_parquet(directory: str | os.PathLike[str]) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the exported tables as views and every projection view.

    Raises ``FileNotFoundError`` when ``directory`` holds no export (no ``manifest.json``).
    """
    root = Path(directory)
    if not (root / "manifest.json").is_file():
        raise FileNotFoundError(f"no Parquet export at {root} (no manifest.json)")
    con = duckdb.connect(":memory:")
    try:
        for table in PARTITIONED:
            target = root / table
            days = any(p.is_dir() for p in target.glob("day=*"))
            source = (
                f"read_parquet('{_sql_path(target)}/day=*/*.parquet', hive_partitioning = true)"
                if days
                else f"read_parquet('{_sql_path(target / 'empty.parquet')}')"
            )
            replace = " REPLACE (CAST(payload AS JSON) AS payload)" if table == "events" else ""
            con.execute(
                f"CREATE VIEW {table} AS SELECT * EXCLUDE (day){replace} FROM {source}"  # noqa: S608
            )
        for table in UNPARTITIONED:
            path = _sql_path(root / table / "data.parquet")
            con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet('{path}')")  # noqa: S608
        for view in _V1_VIEWS:
            con.execute("CREATE VIEW " + view.format(agg=JOB_AGGREGATES))
        for statement in (*VIEW_DDL, *SHARE_VIEW_DDL):
            con.execute(statement)
    except BaseException:
        con.close()
        raise
    return con
