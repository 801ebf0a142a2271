"""``gpuledger project``, ``gpuledger report`` and ``gpuledger sql``.

A thin shell over ``projections.projector`` and ``projections.report``: argument parsing,
output formats, and turning user mistakes (a missing database, bad SQL, a ledger that is
not one) into ``CliError`` messages instead of tracebacks.
"""

from __future__ import annotations

import argparse
import csv
import sys
from typing import TYPE_CHECKING, Any

import duckdb
import msgspec

from events.codec import DecodeError
from projections.projector import ProjectStats, SchemaError, connect, project
from projections.report import REPORT_COLUMNS, Column, render_table, tenant_report

if TYPE_CHECKING:
    from scheduler.cli import CliError

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``project``, ``report`` and ``sql`` sub-commands to the ``gpuledger`` parser."""
    p = sub.add_parser(
        "project",
        help="project a ledger into a DuckDB database (incremental)",
        description="Fold a ledger into DuckDB tables (events, queues, jobs) and views "
        "(tenant_percentiles, overall_percentiles). Re-running adds only new records.",
    )
    p.add_argument("--ledger", required=True, metavar="SRC", help="ledger directory or .jsonl")
    p.add_argument("--db", required=True, metavar="FILE", help="DuckDB file (created if absent)")
    p.add_argument("--rebuild", action="store_true", help="drop the projection, start at 0")
    p.add_argument(
        "--batch-size", type=int, default=50_000, metavar="N", help="records per transaction"
    )
    p.set_defaults(func=_project)

    r = sub.add_parser(
        "report",
        help="per-tenant time-to-ready and completion percentiles",
        description="Per-queue job counts, time-to-ready and completion percentiles, "
        "preemptions and lost GPU hours, plus an 'all' row.",
    )
    r.add_argument("--db", required=True, metavar="FILE", help="projection database")
    r.add_argument("--format", choices=("table", "json"), default="table")
    r.set_defaults(func=_report)

    q = sub.add_parser(
        "sql",
        help="run a read-only SQL query on a projection",
        description="Run one SQL statement against a projection database, read-only. "
        "Tables: events, queues, jobs; views: tenant_percentiles, overall_percentiles. "
        'Quote the reserved column name: events."offset".',
    )
    q.add_argument("--db", required=True, metavar="FILE", help="projection database")
    q.add_argument("query", metavar="SQL", help='e.g. "SELECT * FROM tenant_percentiles"')
    q.add_argument("--format", choices=("table", "csv", "json"), default="table")
    q.set_defaults(func=_sql)


def _cli_error(message: str) -> CliError:
    from scheduler.cli import CliError  # noqa: PLC0415  # the CLI shell imports us lazily

    return CliError(message)


def _project(args: argparse.Namespace) -> int:
    # Imported here: the file log is optional for every other sub-command.
    from events.filelog import LedgerError, open_reader  # noqa: PLC0415

    if args.batch_size < 1:
        raise _cli_error(f"--batch-size must be at least 1, got {args.batch_size}")
    try:
        reader = open_reader(args.ledger)
    except (LedgerError, OSError, ValueError) as exc:
        raise _cli_error(f"cannot open ledger {args.ledger}: {exc}") from exc
    show_progress = sys.stderr.isatty()

    def progress(stats: ProjectStats) -> None:
        sys.stderr.write(f"\rprojected {stats.events_read:,} events up to {stats.next_offset:,}")
        sys.stderr.flush()

    try:
        stats = project(
            reader,
            args.db,
            rebuild=args.rebuild,
            batch_size=args.batch_size,
            progress=progress if show_progress else None,
        )
    except (DecodeError, LedgerError) as exc:
        raise _cli_error(f"ledger {args.ledger}: {exc}") from exc
    except (SchemaError, ValueError, duckdb.Error) as exc:
        raise _cli_error(f"{args.db}: {exc}") from exc
    finally:
        close = getattr(reader, "close", None)
        if callable(close):
            close()
        if show_progress:
            sys.stderr.write("\n")
    if stats.events_read == 0:
        sys.stdout.write(f"{args.db} is up to date (next offset {stats.next_offset})\n")
    else:
        sys.stdout.write(
            f"projected {stats.events_read:,} events ({stats.rows_written:,} rows) into "
            f"{args.db} in {stats.seconds:.2f}s ({stats.events_per_second:,.0f} events/s); "
            f"next offset {stats.next_offset}\n"
        )
    return 0


def _report(args: argparse.Namespace) -> int:
    try:
        rows = tenant_report(args.db)
    except (FileNotFoundError, SchemaError, duckdb.Error) as exc:
        raise _cli_error(str(exc)) from exc
    if args.format == "json":
        sys.stdout.write(msgspec.json.encode(rows).decode() + "\n")
    else:
        sys.stdout.write(render_table(rows, REPORT_COLUMNS) + "\n")
    return 0


def _json_default(value: Any) -> Any:
    return str(value)  # DuckDB types msgspec does not know (intervals, blobs…) as text


def _sql(args: argparse.Namespace) -> int:
    try:
        con = connect(args.db, read_only=True)
    except (FileNotFoundError, SchemaError, duckdb.Error) as exc:
        raise _cli_error(str(exc)) from exc
    try:
        try:
            cur = con.execute(args.query)
            description = cur.description or []
            names = [d[0] for d in description]
            values = cur.fetchall() if names else []
        except duckdb.Error as exc:
            raise _cli_error(f"SQL error: {exc}") from exc
    finally:
        con.close()
    if not names:
        return 0  # a statement without a result set
    if args.format == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(names)
        writer.writerows(values)
    elif args.format == "json":
        # JSON columns (events.payload) come back as text: nest them as objects instead.
        nested = [str(d[1]) == "JSON" for d in description]
        rows = [
            {
                name: msgspec.json.decode(x) if is_json and isinstance(x, str) else x
                for name, x, is_json in zip(names, v, nested, strict=True)
            }
            for v in values
        ]
        sys.stdout.write(msgspec.json.encode(rows, enc_hook=_json_default).decode() + "\n")
    else:
        # Positional keys: a result may repeat a column name (SELECT 1 AS a, 2 AS a).
        columns = [Column(str(i), name, "raw") for i, name in enumerate(names)]
        cells = [{str(i): x for i, x in enumerate(v)} for v in values]
        sys.stdout.write(render_table(cells, columns) + "\n")
    return 0
