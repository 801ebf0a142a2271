"""``gpuledger metrics import``: GPU monitoring samples (DCGM dump or CSV) into a ledger
(``events.metrics``).
"""

from __future__ import annotations

import argparse
import sys

from scheduler.cli.errors import CliError, ledger_errors, refuse_kafka_url

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``gpuledger metrics`` to the ``gpuledger`` parser."""
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
