"""``gpuledger serve``: argument parsing and user errors for ``projections.console.app``.

The server's libraries (Starlette, uvicorn, Jinja2) are imported only when ``serve``
runs, so the rest of the command line starts without them.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from scheduler.cli.errors import (
    CliError,
    add_damage_options,
    check_ledger,
    ledger_errors,
    open_ledger,
)

__all__ = ["default_db", "register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``serve`` to the ``gpuledger`` parser."""
    s = sub.add_parser(
        "serve",
        help="follow a ledger and serve a live web console and JSON API over its projection",
        description="Own the projection of a ledger (follow it and project incrementally, "
        "as `project --follow` does) and serve the web console (Queues, Jobs, Nodes, "
        "Tenants) and a JSON API from it. While it runs, `sql` and `report` on the same "
        "database ask it instead of opening the file. See docs/console.md.",
    )
    s.add_argument("--ledger", required=True, metavar="SRC", help="ledger directory or kafka://…")
    s.add_argument(
        "--db",
        metavar="FILE",
        help="projection database (default: history.duckdb beside a ledger directory)",
    )
    s.add_argument(
        "--listen",
        default="127.0.0.1:8080",
        metavar="HOST:PORT",
        help="address to bind (default 127.0.0.1:8080; port 0 picks a free one); a "
        "non-local address needs --token",
    )
    s.add_argument(
        "--token",
        default=os.environ.get("GPULEDGER_TOKEN") or None,
        metavar="T",
        help="require this token from every client (default: $GPULEDGER_TOKEN)",
    )
    s.add_argument(
        "--interval", type=float, default=0.5, metavar="S", help="seconds between follow runs"
    )
    limits = s.add_argument_group(
        "SQL limits",
        "bounds on /api/sql (and `sql`/`report` through the console), whose queries see "
        "only the projection: no file, URL, extension or setting (docs/console.md)",
    )
    limits.add_argument(
        "--sql-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="interrupt a query still running after S seconds (default 10)",
    )
    limits.add_argument(
        "--sql-max-rows",
        type=int,
        default=10_000,
        metavar="N",
        help="return at most N rows of an answer, marked truncated (default 10000)",
    )
    limits.add_argument(
        "--sql-max-bytes",
        type=int,
        default=32 * 1024 * 1024,
        metavar="N",
        help="return at most N bytes of rows (JSON) of an answer, marked truncated "
        "(default 33554432, 32 MiB)",
    )
    limits.add_argument(
        "--sql-memory",
        default="1GB",
        metavar="SIZE",
        help="DuckDB memory limit of the console's database, e.g. 512MB, 2GB (default 1GB); "
        "the follower's projection shares it",
    )
    limits.add_argument(
        "--sql-concurrency",
        type=int,
        default=4,
        metavar="N",
        help="queries running at once; more answer 429 (default 4)",
    )
    add_damage_options(s)
    s.set_defaults(func=_serve)


def default_db(ledger: str) -> str:
    """``history.duckdb`` beside a ledger directory, as ``gpuledger demo`` lays them out."""
    if "://" in ledger:
        raise CliError(f"--db is required for the ledger {ledger} (no directory to put it in)")
    return str(Path(ledger).parent / "history.duckdb")


def _db_error(exc: BaseException) -> str:
    """DuckDB's "Could not set lock on file" as what it means here: another process (a
    second ``serve``, or ``project --follow``) owns the projection."""
    text = str(exc)
    if "Could not set lock" in text:
        return (
            "another process has this projection open for writing (a `gpuledger serve` or "
            "`project --follow` on it): ask that console (`sql --db` and `report --db` find "
            "it), stop it, or give this one another --db"
        )
    return text


def _serve(args: argparse.Namespace) -> int:
    import duckdb  # noqa: PLC0415

    from projections.console.app import (  # noqa: PLC0415  # the server's libraries
        Console,
        ListenError,
        check_listen,
        parse_listen,
        serve,
    )
    from projections.console.sandbox import SqlLimits  # noqa: PLC0415
    from projections.projector import SchemaError  # noqa: PLC0415

    try:
        host, port = parse_listen(args.listen)
        check_listen(host, args.token)
    except ListenError as exc:
        raise CliError(str(exc)) from exc
    try:
        limits = SqlLimits(
            timeout_s=args.sql_timeout,
            max_rows=args.sql_max_rows,
            max_bytes=args.sql_max_bytes,
            memory_limit=args.sql_memory,
            max_concurrent=args.sql_concurrency,
        )
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    db = args.db or default_db(args.ledger)
    check_ledger(args.ledger, args)
    reader = open_ledger(args.ledger)

    def log(message: str) -> None:
        sys.stderr.write(f"gpuledger serve: {message}\n")
        sys.stderr.flush()

    console = Console(
        reader,
        db,
        source=args.ledger,
        interval_s=args.interval,
        token=args.token,
        sql_limits=limits,
        log=log,
    )
    try:
        with ledger_errors(f"{args.ledger}: "):  # a damaged ledger: say where, as `project` does
            console.open()
    except CliError:
        reader.close()
        raise
    except (SchemaError, ValueError, OSError, duckdb.Error) as exc:
        reader.close()
        raise CliError(f"{db}: {_db_error(exc)}") from exc

    def ready(url: str) -> None:
        sys.stdout.write(f"gpuledger console on {url} (ledger {args.ledger}, database {db})\n")
        sys.stdout.flush()

    try:
        serve(console, host, port, ready=ready)
    except KeyboardInterrupt:
        pass
    except SystemExit as exc:  # uvicorn exits when it cannot bind, after logging why
        raise CliError(f"cannot listen on {args.listen}") from exc
    except OSError as exc:
        raise CliError(f"cannot listen on {args.listen}: {exc}") from exc
    finally:
        reader.close()
    return 0
