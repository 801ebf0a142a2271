"""``gpuledger sql``: one read-only SQL statement, or a small shell, over a projection.

On a file (``--db``, ``--parquet``) DuckDB runs here; through a console (``--server``, or
``--db`` while ``serve`` owns the file) its ``/api/sql`` endpoint answers.
"""

from __future__ import annotations

import argparse
import csv
import sys
import warnings
from typing import IO, Any

import duckdb
import msgspec

from scheduler.cli.common import add_source, json_default, open_source, output_to, server_of
from scheduler.cli.errors import CliError
from scheduler.render.table import Column, render_table

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``gpuledger sql`` to the ``gpuledger`` parser."""
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
    add_source(q)
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
    server = server_of(args)
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
    con = open_source(args)
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
    with output_to(args.output) as out:
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
        out.write(msgspec.json.encode(rows, enc_hook=json_default).decode() + "\n")
    else:
        # Positional keys: a result may repeat a column name (SELECT 1 AS a, 2 AS a).
        columns = [Column(str(i), name, "raw") for i, name in enumerate(names)]
        cells = [{str(i): x for i, x in enumerate(v)} for v in values]
        out.write(render_table(cells, columns) + "\n")
