"""``gpuledger project``, ``report``, ``sql``, ``export`` and ``metrics import``.

A thin shell over ``projections.projector``, ``projections.report``, ``projections.html``,
``projections.parquet`` and ``events.metrics``: argument parsing, output formats, and
turning user mistakes (a missing database, bad SQL, a ledger that is not one, a malformed
monitoring dump) into ``CliError`` messages instead of tracebacks.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import duckdb
import msgspec

from events.ledgertime import format_duration
from events.port import LedgerReader
from projections.projector import ProjectStats, SchemaError, connect, project
from projections.report import full_report, parse_window, render_full_report
from scheduler.cli.errors import (
    CliError,
    add_damage_options,
    check_ledger,
    ledger_errors,
    open_ledger,
    refuse_kafka_url,
)
from scheduler.render.table import Column, render_table

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``project``, ``report`` and ``sql`` sub-commands to the ``gpuledger`` parser."""
    p = sub.add_parser(
        "project",
        help="project a ledger into a DuckDB database (incremental)",
        description="Fold a ledger into DuckDB tables (events, queues, jobs) and views "
        "(tenant_percentiles, overall_percentiles). Re-running adds only new records.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--ledger", metavar="SRC", help="ledger directory, .jsonl or kafka://…")
    src.add_argument(
        "--follow", metavar="SRC", help="keep projecting a live ledger (kafka://… or directory)"
    )
    p.add_argument("--interval", type=float, default=1.0, help="--follow: seconds between runs")
    p.add_argument("--db", required=True, metavar="FILE", help="DuckDB file (created if absent)")
    p.add_argument("--rebuild", action="store_true", help="drop the projection, start at 0")
    p.add_argument(
        "--batch-size", type=int, default=50_000, metavar="N", help="records per transaction"
    )
    add_damage_options(p)
    p.set_defaults(func=_project_or_follow)

    r = sub.add_parser(
        "report",
        help="per-tenant time-to-ready and completion percentiles",
        description="Per-queue job counts, time-to-ready and completion percentiles, "
        "preemptions and lost GPU hours, plus an 'all' row.",
    )
    _add_source(r)
    r.add_argument(
        "--window",
        metavar="SPAN",
        help="only the last SPAN of ledger time, e.g. 24h, 7d (default: all history)",
    )
    r.add_argument("--format", choices=("table", "json", "html"), default="table")
    r.add_argument("--output", "-o", metavar="FILE", help="write to FILE instead of stdout")
    r.set_defaults(func=_report)

    q = sub.add_parser(
        "sql",
        help="run a read-only SQL query on a projection",
        description="Run one SQL statement against a projection database, read-only. "
        "Tables: events, queues, jobs; views: tenant_percentiles, overall_percentiles. "
        'Quote the reserved column name: events."offset". '
        "On a file (--db, --parquet) this is a full DuckDB session of your own user: "
        "read_csv, glob and the rest reach whatever files you can read. Through a console "
        "(--server, or --db while `serve` owns the file) queries see only the projection, "
        "within the console's time, row and memory limits (docs/console.md).",
    )
    _add_source(q)
    q.add_argument(
        "query",
        metavar="SQL",
        nargs="?",
        help='e.g. "SELECT * FROM tenant_percentiles"; without it, an interactive shell '
        "reads statements ending in ';' from stdin",
    )
    q.add_argument("--format", choices=("table", "csv", "json", "parquet"), default="table")
    q.add_argument("--output", "-o", metavar="FILE", help="write to FILE (required for parquet)")
    q.set_defaults(func=_sql)

    e = sub.add_parser(
        "export",
        help="export a projection as Parquet files partitioned by day",
        description="Write every projection table under DIR as Parquet (time-stamped tables "
        "partitioned by day of ledger time). `sql --parquet DIR` and `report --parquet DIR` "
        "run the same views over the export.",
    )
    e.add_argument("--db", required=True, metavar="FILE", help="projection database")
    e.add_argument("--parquet", required=True, metavar="DIR", help="output directory")
    e.set_defaults(func=_export)

    m = sub.add_parser("metrics", help="import GPU monitoring data into a ledger")
    mcmds = m.add_subparsers(dest="metrics_command", required=True, metavar="SUBCOMMAND")
    mi = mcmds.add_parser(
        "import",
        help="append GPU utilisation samples (DCGM exporter dump or CSV) to a ledger",
        description="Append gpu_utilization_sampled events to a ledger directory, from a "
        "Prometheus text dump of the DCGM exporter (DCGM_FI_DEV_GPU_UTIL, "
        "DCGM_FI_DEV_FB_USED) or a CSV with timestamp_ms,node,gpu,utilization_pct"
        "[,memory_used_mib].",
    )
    mi.add_argument("file", metavar="FILE", help="the dump or CSV file")
    mi.add_argument("--format", choices=("dcgm", "csv"), required=True)
    mi.add_argument(
        "--ledger", required=True, metavar="DIR", help="ledger directory (not kafka://)"
    )
    mi.add_argument(
        "--at", type=int, metavar="MS", help="time (ms) for dump lines without a timestamp"
    )
    mi.add_argument(
        "--shift-ms",
        type=int,
        default=0,
        metavar="N",
        help="add N ms to every sample time (align monitoring with ledger time)",
    )
    mi.set_defaults(func=_metrics_import)


def _add_source(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--db",
        metavar="FILE",
        help="projection database (asked through its `gpuledger serve` when one runs)",
    )
    source.add_argument("--parquet", metavar="DIR", help="a `gpuledger export --parquet` dir")
    source.add_argument(
        "--server", metavar="URL", help="a running `gpuledger serve`, e.g. http://127.0.0.1:8080"
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("GPULEDGER_TOKEN") or None,
        metavar="T",
        help="--server: the console's token (default: $GPULEDGER_TOKEN)",
    )


def _server_of(args: argparse.Namespace) -> str | None:
    """The console to ask: ``--server``, or the ``serve`` that owns ``--db`` right now.

    Readers go through the server that owns a file rather than open it beside the
    writer, which would fail on DuckDB's file lock while the follower projects.
    """
    from projections.console.client import find_server  # noqa: PLC0415

    if args.server is not None:
        return str(args.server)
    if args.db is not None:
        return find_server(args.db, args.token)
    return None


def _open_source(args: argparse.Namespace) -> duckdb.DuckDBPyConnection:
    from projections.parquet import open_parquet  # noqa: PLC0415  # only for --parquet

    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            if args.parquet is not None:
                return open_parquet(args.parquet)
            return connect(args.db, read_only=True)
        except duckdb.IOException as exc:
            # `project --follow` holds the file's lock while a run writes and lets go
            # between runs: wait for a gap rather than fail.
            if not _is_lock_error(exc):
                raise CliError(str(exc)) from exc
            if time.monotonic() > deadline:
                raise CliError(f"{exc}; read it through `gpuledger serve`") from exc
            time.sleep(0.1)
        except (FileNotFoundError, SchemaError, duckdb.Error) as exc:
            raise CliError(str(exc)) from exc


LOCK_WAIT_S = 10.0
"""How long ``sql``/``report`` wait for a projecting process to let go of the file."""


def _is_lock_error(exc: BaseException) -> bool:
    """DuckDB's "Could not set lock on file": another process has the file open to write."""
    return isinstance(exc, duckdb.IOException) and "Could not set lock" in str(exc)


@contextlib.contextmanager
def _output(path: str | None) -> Iterator[IO[str]]:
    if path is None:
        yield sys.stdout
        return
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            yield f
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc}") from exc


def _project_or_follow(args: argparse.Namespace) -> int:
    """``--follow``: re-run the (incremental, idempotent) projection until interrupted.

    One reader serves every run, so a Kafka ledger is not reconnected each interval.
    """
    if args.batch_size < 1:
        raise CliError(f"--batch-size must be at least 1, got {args.batch_size}")
    source = args.ledger if args.follow is None else args.follow
    check_ledger(source, args)  # before the database is touched
    reader = open_ledger(source)
    try:
        if args.follow is None:
            return _project(args, reader, source)
        try:
            while True:
                try:
                    _project(args, reader, source)
                    args.rebuild = False
                except CliError as exc:
                    # A reader that opened the file (`sql --db`) holds its lock for a while:
                    # a follower waits for it and carries on instead of exiting.
                    if exc.__cause__ is None or not _is_lock_error(exc.__cause__):
                        raise
                    sys.stderr.write(f"gpuledger: {exc}; retrying\n")
                time.sleep(args.interval)
        except KeyboardInterrupt:
            return 0
    finally:
        reader.close()


def _project(args: argparse.Namespace, reader: LedgerReader, source: str) -> int:
    """One incremental run of the projection of ``reader`` (``source``) into ``--db``."""
    show_progress = sys.stderr.isatty()

    def progress(stats: ProjectStats) -> None:
        sys.stderr.write(f"\rprojected {stats.events_read:,} events up to {stats.next_offset:,}")
        sys.stderr.flush()

    try:
        with ledger_errors(f"ledger {source}: "):
            stats = project(
                reader,
                args.db,
                rebuild=args.rebuild,
                batch_size=args.batch_size,
                progress=progress if show_progress else None,
            )
    except (SchemaError, ValueError, duckdb.Error) as exc:
        raise CliError(f"{args.db}: {exc}") from exc
    finally:
        if show_progress:
            sys.stderr.write("\n")
    if stats.events_read == 0:
        sys.stdout.write(f"{args.db} is up to date (next offset {stats.next_offset})\n")
    else:
        sys.stdout.write(
            f"projected {stats.events_read:,} events ({stats.rows_written:,} rows) into "
            f"{args.db} in {format_duration(stats.seconds)} "
            f"({stats.events_per_second:,.0f} events/s); "
            f"next offset {stats.next_offset}\n"
        )
    sys.stdout.flush()  # --follow prints a line per run: let a pipe see each as it comes
    return 0


def _report(args: argparse.Namespace) -> int:
    try:
        window = parse_window(args.window) if args.window else None
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    server = _server_of(args)
    if server is not None:
        report = _ask(server, args, "/api/report", window=args.window)
    else:
        con = _open_source(args)
        try:
            report = full_report(con, window)
        except duckdb.Error as exc:
            raise CliError(f"report failed: {exc}") from exc
        finally:
            con.close()
    with _output(args.output) as out:
        if args.format == "json":
            out.write(msgspec.json.encode(report, enc_hook=_json_default).decode() + "\n")
        elif args.format == "html":
            from projections.html import render_html  # noqa: PLC0415  # only for html

            name = args.db or args.parquet or args.server
            out.write(render_html(report, title=f"gpuledger report: {name}"))
        else:
            out.write(render_full_report(report) + "\n")
    return 0


def _export(args: argparse.Namespace) -> int:
    from projections.parquet import export_parquet  # noqa: PLC0415

    try:
        rows = export_parquet(args.db, args.parquet)
    except (FileNotFoundError, SchemaError, duckdb.Error, OSError) as exc:
        raise CliError(str(exc)) from exc
    sys.stdout.write(f"exported {rows:,} rows of {args.db} to {args.parquet}\n")
    return 0


def _metrics_import(args: argparse.Namespace) -> int:
    from events.filelog import FileLedger  # noqa: PLC0415
    from events.metrics import MetricsError, envelopes, read_samples  # noqa: PLC0415

    refuse_kafka_url(args.ledger, "--ledger", "metrics import", "a ledger directory")
    try:
        samples = read_samples(args.file, args.format, default_at=args.at, shift_ms=args.shift_ms)
    except MetricsError as exc:
        raise CliError(str(exc)) from exc
    with ledger_errors(f"cannot open ledger {args.ledger}: "):
        writer = FileLedger.open(args.ledger, create=False)
    try:
        with ledger_errors(f"ledger {args.ledger}: "):
            batch = list(envelopes(samples))
            first = writer.append(batch) if batch else writer.end_offset()
    finally:
        writer.close()
    nodes = len({s.node for s in samples})
    sys.stdout.write(
        f"imported {len(samples):,} GPU utilisation samples from {nodes} node(s) into "
        f"{args.ledger} at offsets {first}..{first + len(samples)}\n"
    )
    return 0


def _json_default(value: Any) -> Any:
    return str(value)  # DuckDB types msgspec does not know (intervals, blobs…) as text


def _ask(server: str, args: argparse.Namespace, path: str, **params: Any) -> Any:
    from projections.console.client import ServerError, get_json  # noqa: PLC0415

    try:
        return get_json(server, path, args.token, **params)
    except ServerError as exc:
        raise CliError(str(exc)) from exc


class _Remote:
    """The part of a DuckDB connection that ``sql`` uses, answered by a console's
    read-only ``/api/sql`` endpoint."""

    def __init__(self, server: str, token: str | None) -> None:
        self.server, self.token = server, token
        self.description: list[tuple[str, str]] | None = None
        self._rows: list[Any] = []

    def execute(self, query: str) -> _Remote:
        from projections.console.client import ServerError, post_json  # noqa: PLC0415

        try:
            answer = post_json(self.server, "/api/sql", self.token, {"query": query})
        except ServerError as exc:
            raise CliError(str(exc)) from exc
        self.description = list(zip(answer["columns"], answer["types"], strict=True)) or None
        self._rows = [tuple(r) for r in answer["rows"]]
        if answer.get("truncated"):
            sys.stderr.write(
                f"gpuledger sql: the console answered the first {len(self._rows):,} rows only "
                f"(its limit of {answer.get('limit', 'rows')}); narrow the query or add LIMIT\n"
            )
        return self

    def fetchall(self) -> list[Any]:
        return self._rows

    def close(self) -> None:
        pass


def _sql(args: argparse.Namespace) -> int:
    if args.format == "parquet" and not args.output:
        raise CliError("--format parquet needs --output FILE")
    server = _server_of(args)
    if server is not None:
        if args.format == "parquet":
            raise CliError(
                "--format parquet reads the file itself: not through a console (--server); "
                "use --format csv or json, or stop the console"
            )
        remote: Any = _Remote(server, args.token)
        if args.query is None:
            return _shell(remote, args)
        _run_query(remote, args.query, args)
        return 0
    con = _open_source(args)
    try:
        if args.query is None:
            return _shell(con, args)
        _run_query(con, args.query, args)
    finally:
        con.close()
    return 0


_PROMPT, _MORE = "gpuledger> ", "      ...> "


def _shell(con: Any, args: argparse.Namespace) -> int:
    """A small REPL: statements end with ';'; errors are printed and the shell goes on."""
    interactive = sys.stdin.isatty()
    if interactive:
        sys.stderr.write("gpuledger SQL shell: end statements with ';', quit with .quit or ^D\n")
    buffer: list[str] = []
    failed = False
    while True:
        if interactive:
            sys.stderr.write(_MORE if buffer else _PROMPT)
            sys.stderr.flush()
        line = sys.stdin.readline()
        if not line:
            break
        if not buffer and line.strip() in (".quit", ".exit"):
            break
        if not buffer and line.strip() == ".tables":
            line = "SELECT table_name, table_type FROM information_schema.tables ORDER BY 1;"
        buffer.append(line)
        statement = "".join(buffer).strip()
        if not statement.endswith(";"):
            continue
        buffer = []
        if statement.strip(";").strip():
            try:
                _run_query(con, statement, args)
            except Exception as exc:  # a shell reports any error and carries on
                failed = True
                sys.stderr.write(f"gpuledger: {exc}\n")
        sys.stdout.flush()
    if "".join(buffer).strip():
        try:
            _run_query(con, "".join(buffer), args)
        except Exception as exc:  # as above
            failed = True
            sys.stderr.write(f"gpuledger: {exc}\n")
    return 1 if failed and not interactive else 0


def _run_query(con: Any, query: str, args: argparse.Namespace) -> None:
    try:
        if args.format == "parquet":
            import pyarrow.parquet as pq  # noqa: PLC0415  # only for parquet output

            cur = con.execute(query)
            if cur.description:  # else a statement without a result set
                with warnings.catch_warnings():
                    # DuckDB warns that a cursor's Arrow result costs one extra copy; the
                    # relation API that avoids it fails on a file opened read-only twice.
                    warnings.simplefilter("ignore", UserWarning)
                    table = cur.to_arrow_table()
                pq.write_table(table, args.output)
            return
        cur = con.execute(query)
        description = cur.description or []
        names = [d[0] for d in description]
        values = cur.fetchall() if names else []
    except duckdb.Error as exc:
        raise CliError(f"SQL error: {exc}") from exc
    if not names:
        return  # a statement without a result set
    with _output(args.output) as out:
        _write_rows(out, args.format, names, description, values)


def _write_rows(
    out: IO[str], fmt: str, names: list[str], description: list[Any], values: list[Any]
) -> None:
    if fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(names)
        writer.writerows(values)
    elif fmt == "json":
        # JSON columns (events.payload) come back as text: nest them as objects instead.
        nested = [str(d[1]) == "JSON" for d in description]
        rows = [
            {
                name: msgspec.json.decode(x) if is_json and isinstance(x, str) else x
                for name, x, is_json in zip(names, v, nested, strict=True)
            }
            for v in values
        ]
        out.write(msgspec.json.encode(rows, enc_hook=_json_default).decode() + "\n")
    else:
        # Positional keys: a result may repeat a column name (SELECT 1 AS a, 2 AS a).
        columns = [Column(str(i), name, "raw") for i, name in enumerate(names)]
        cells = [{str(i): x for i, x in enumerate(v)} for v in values]
        out.write(render_table(cells, columns) + "\n")
