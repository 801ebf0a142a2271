"""``gpuledger compare``: one workload under several policies, side by side (``replay.compare``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from replay.config import ConfigError, PolicyFile, load
from scheduler.cli.common import load_inputs, run_compare
from scheduler.cli.errors import CliError, refuse_kafka_url
from scheduler.core.policy import POLICIES

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``gpuledger compare`` to the ``gpuledger`` parser."""
    p = sub.add_parser("compare", help="one workload under several policies, side by side")
    p.add_argument("--cluster", required=True, help="cluster.yaml")
    p.add_argument("--queues", required=True, help="queues.yaml")
    p.add_argument("--workload", required=True, help="workload.yaml")
    p.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help=f"comma-separated (default: {','.join(POLICIES)})",
    )
    p.add_argument("--policy-file", help="policy.yaml knobs for the gang policy")
    p.add_argument("--out", default="out/compare", help="ledgers, compare.json, compare.html")
    p.add_argument("--workers", type=int, default=2, help="parallel simulations (default 2)")
    p.add_argument(
        "--skip-invalid",
        action="store_true",
        help="leave out an input the scheduler refuses, with a warning and a count, "
        "instead of stopping",
    )
    p.set_defaults(func=_compare)


def _compare(args: argparse.Namespace) -> int:
    refuse_kafka_url(args.out, "--out", "compare", "a directory for the ledgers and reports")
    cluster, queues, workload = load_inputs(args.cluster, args.queues, args.workload)
    try:
        knobs = load(args.policy_file, PolicyFile) if args.policy_file else None
    except ConfigError as exc:
        raise CliError(str(exc)) from exc
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    title = f"gpuledger compare: {Path(args.workload).name} on {Path(args.cluster).name}"
    run_compare(
        cluster,
        queues,
        workload,
        policies,
        Path(args.out),
        knobs,
        args.workers,
        title,
        files={"job": args.workload, "queue": args.queues, "node": args.cluster},
        skip_invalid=args.skip_invalid,
    )
    return 0
