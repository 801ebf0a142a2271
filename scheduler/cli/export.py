"""``gpuledger export``: a projection as Parquet files partitioned by day
(``projections.parquet``)."""

from __future__ import annotations

import argparse
import sys

import duckdb

from projections.projector import SchemaError
from scheduler.cli.errors import CliError

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``gpuledger export`` to the ``gpuledger`` parser."""
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


def _export(args: argparse.Namespace) -> int:
    from projections.parquet import export_parquet  # noqa: PLC0415

    try:
        rows = export_parquet(args.db, args.parquet)
    except (FileNotFoundError, SchemaError, duckdb.Error, OSError) as exc:
        raise CliError(str(exc)) from exc
    sys.stdout.write(f"exported {rows:,} rows of {args.db} to {args.parquet}\n")
    return 0
