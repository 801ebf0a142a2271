"""``gpuledger scheduler run``: the live scheduler service on Kafka
(``scheduler.runtime.service``).
"""

from __future__ import annotations

import argparse
import logging

from scheduler.cli.common import add_kafka_arguments, add_policy_flag, settings_of
from scheduler.cli.errors import CliError, kafka_errors
from scheduler.fold.snapshot import PART_BYTES

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``gpuledger scheduler`` to the ``gpuledger`` parser."""
    sched = sub.add_parser("scheduler", help="the live scheduler service on Kafka")
    cmds = sched.add_subparsers(dest="scheduler_command", required=True, metavar="SUBCOMMAND")
    run = cmds.add_parser("run", help="consume intake, schedule, append to the ledger")
    add_kafka_arguments(run)
    run.add_argument("--max-batch", type=int, default=1000, help="intake records per cycle")
    run.add_argument(
        "--snapshot-every", type=int, default=50_000, help="ledger records per snapshot"
    )
    run.add_argument(
        "--snapshot-part-bytes",
        type=int,
        default=PART_BYTES,
        help="write a larger snapshot as records of at most this many bytes",
    )
    run.add_argument("--session-timeout-ms", type=int, default=3000, help="failover detection time")
    run.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on 127.0.0.1:PORT")
    run.add_argument(
        "--metrics-addr",
        metavar="HOST:PORT",
        help="serve Prometheus metrics on this address (e.g. 0.0.0.0:9100 in a container)",
    )
    run.add_argument(
        "--max-skew-s",
        type=float,
        default=60.0,
        help="dead-letter intake stamped more than this ahead of the scheduler's clock",
    )
    add_policy_flag(run)
    run.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    run.set_defaults(func=kafka_errors(_run))


def _run(args: argparse.Namespace) -> int:
    from scheduler.runtime.service import ServiceConfig, run_service  # noqa: PLC0415

    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    metrics_host, metrics_port = "127.0.0.1", args.metrics_port
    if args.metrics_addr:
        host, sep, port = args.metrics_addr.rpartition(":")
        if not sep or not port.isdigit():
            raise CliError(f"--metrics-addr {args.metrics_addr!r}: expected HOST:PORT")
        metrics_host, metrics_port = host or "0.0.0.0", int(port)  # noqa: S104  # asked for
    return run_service(
        ServiceConfig(
            settings=settings_of(args),
            domain=args.domain,
            max_batch=args.max_batch,
            snapshot_every=args.snapshot_every,
            snapshot_part_bytes=args.snapshot_part_bytes,
            session_timeout_ms=args.session_timeout_ms,
            metrics_port=metrics_port,
            metrics_host=metrics_host,
            max_skew_ms=round(args.max_skew_s * 1000),
            policy=args.policy,
        )
    )
