"""``gpuledger report``: the per-tenant report of a projection, as a table, JSON or HTML.

Over ``projections.report`` and ``projections.html``; read from a database, a Parquet
export or a running console (``gpuledger serve``).
"""

from __future__ import annotations

import argparse

import duckdb
import msgspec

from projections.report import full_report, parse_window, render_full_report
from scheduler.cli.common import (
    add_source,
    ask_server,
    json_default,
    open_source,
    output_to,
    server_of,
)
from scheduler.cli.errors import CliError

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``gpuledger report`` to the ``gpuledger`` parser."""
    r = sub.add_parser(
        "report",
        help="per-tenant time-to-ready and completion percentiles",
        description="Per-queue job counts, time-to-ready and completion percentiles, "
        "preemptions and lost GPU hours, plus an 'all' row.",
    )
    add_source(r)
    r.add_argument(
        "--window",
        metavar="SPAN",
        help="only the last SPAN of ledger time, e.g. 24h, 7d (default: all history)",
    )
    r.add_argument("--format", choices=("table", "json", "html"), default="table")
    r.add_argument("--output", "-o", metavar="FILE", help="write to FILE instead of stdout")
    r.set_defaults(func=_report)


def _report(args: argparse.Namespace) -> int:
    try:
        window = parse_window(args.window) if args.window else None
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    server = server_of(args)
    if server is not None:
        report = ask_server(server, args, "/api/report", window=args.window)
    else:
        con = open_source(args)
        try:
            report = full_report(con, window)
        except duckdb.Error as exc:
            raise CliError(f"report failed: {exc}") from exc
        finally:
            con.close()
    with output_to(args.output) as out:
        if args.format == "json":
            out.write(msgspec.json.encode(report, enc_hook=json_default).decode() + "\n")
        elif args.format == "html":
            from projections.html import render_html  # noqa: PLC0415  # only for html

            name = args.db or args.parquet or args.server
            out.write(render_html(report, title=f"gpuledger report: {name}"))
        else:
            out.write(render_full_report(report) + "\n")
    return 0
