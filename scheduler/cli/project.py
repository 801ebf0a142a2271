"""``gpuledger project``: fold a ledger into a DuckDB projection, once or following it.

A thin shell over ``projections.projector``; a user's mistake (a ledger that is not one,
a database of another schema) is a ``CliError`` message instead of a traceback.
"""

from __future__ import annotations

import argparse
import sys
import time

import duckdb

from events.ledgertime import format_duration
from events.port import LedgerReader
from projections.projector import ProjectStats, SchemaError, project
from scheduler.cli.common import is_lock_error
from scheduler.cli.errors import (
    CliError,
    add_damage_options,
    check_ledger,
    ledger_errors,
    open_ledger,
)

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``gpuledger project`` to the ``gpuledger`` parser."""
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
                    if exc.__cause__ is None or not is_lock_error(exc.__cause__):
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
