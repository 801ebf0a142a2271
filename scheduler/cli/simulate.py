"""``gpuledger simulate``: a workload on a cluster through the simulator, writing a ledger
(``replay.sim``), optionally projected and reported.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import msgspec

from events.ledgertime import format_duration
from replay.config import ConfigError, PolicyFile, load, policy_event
from scheduler.cli.common import fresh_dir, load_inputs, print_refusals, simulate_into
from scheduler.cli.errors import CliError, refuse_kafka_url
from scheduler.core.policy import POLICIES

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``gpuledger simulate`` to the ``gpuledger`` parser."""
    p = sub.add_parser("simulate", help="simulate a workload on a cluster, writing a ledger")
    p.add_argument("--cluster", required=True, help="cluster.yaml")
    p.add_argument("--queues", required=True, help="queues.yaml")
    p.add_argument("--workload", required=True, help="workload.yaml")
    p.add_argument("--policy", default="gpuledger", choices=POLICIES, help="default: gpuledger")
    p.add_argument("--policy-file", help="policy.yaml: the policy's knobs (docs/formats.md)")
    p.add_argument("--ledger", required=True, help="directory for the new ledger")
    p.add_argument("--seed", type=int, help="override the workload's seed")
    p.add_argument("--db", help="also project the ledger into this DuckDB file and report")
    p.add_argument("--force", action="store_true", help="replace an existing ledger directory")
    p.add_argument(
        "--skip-invalid",
        action="store_true",
        help="leave out an input the scheduler refuses, with a warning and a count, "
        "instead of stopping",
    )
    p.add_argument(
        "--no-fairness", action="store_true", help="skip the fair-share convergence table"
    )
    p.set_defaults(func=_simulate)


def _simulate(args: argparse.Namespace) -> int:
    refuse_kafka_url(args.ledger, "--ledger", "simulate", "a directory for the new ledger")
    cluster, queues, workload = load_inputs(args.cluster, args.queues, args.workload)
    if args.seed is not None:
        workload = msgspec.structs.replace(workload, seed=args.seed)
    try:
        knobs = load(args.policy_file, PolicyFile) if args.policy_file else PolicyFile()
        policy = policy_event(args.policy, knobs)
    except ConfigError as exc:
        raise CliError(str(exc)) from exc
    ledger = Path(args.ledger)
    fresh_dir(ledger, args.force, create=False)
    from replay.fairness import FairnessMonitor  # noqa: PLC0415
    from scheduler.render.table import render_table  # noqa: PLC0415

    monitor = None if args.no_fairness else FairnessMonitor()
    started = time.perf_counter()
    result = simulate_into(
        cluster,
        queues,
        workload,
        policy,
        ledger,
        show_progress=True,
        observe=monitor.observe if monitor is not None else None,
        files={"job": args.workload, "queue": args.queues, "node": args.cluster},
        skip_invalid=args.skip_invalid,
    )
    elapsed = time.perf_counter() - started
    print(
        f"{result.policy}: {result.jobs} jobs, {result.cycles} cycles, {result.records} ledger "
        f"records, simulated {format_duration(result.end_ms / 1000)} in {format_duration(elapsed)}"
    )
    print("job outcomes: " + ", ".join(f"{k} {v}" for k, v in result.statuses.items()))
    print(result.gang_summary())
    print_refusals(
        result.refused, {"job": args.workload, "queue": args.queues, "node": args.cluster}
    )
    if monitor is not None and monitor.rows():
        print("\nfair share under contention (queue has work waiting that free GPUs cannot hold):")
        print(render_table(monitor.rows(), list(monitor.rows()[0])))
    print(f"ledger: {ledger}")
    if args.db:
        from events.sources import open_reader  # noqa: PLC0415
        from projections.projector import project  # noqa: PLC0415
        from projections.report import REPORT_COLUMNS, tenant_report  # noqa: PLC0415
        from scheduler.render.table import render_table  # noqa: PLC0415

        project(open_reader(ledger), args.db, rebuild=True)
        rows = tenant_report(args.db)
        print(render_table(rows, REPORT_COLUMNS))
    return 0
