"""``gpuledger simulate | replay | demo | schema``: thin shells over the library."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from events.model import PolicyConfigured
from replay.config import (
    ClusterFile,
    ConfigError,
    PolicyFile,
    QueuesFile,
    WorkloadFile,
    json_schema,
    kinds,
    load,
    policy_event,
)
from scheduler.core.policy import POLICIES

EXAMPLES = Path(__file__).parent / "examples"


def register(sub: Any) -> None:
    """Add this package's sub-commands to the ``gpuledger`` parser."""
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
        "--no-fairness", action="store_true", help="skip the fair-share convergence table"
    )
    p.set_defaults(func=_simulate)

    p = sub.add_parser("replay", help="re-run a ledger's inputs through the core")
    p.add_argument("--ledger", required=True, help="ledger directory or JSON Lines export")
    p.add_argument("--verify", action="store_true", help="check every decision is reproduced")
    p.add_argument("--from", dest="start", type=int, default=0, help="first offset")
    p.add_argument("--until", dest="end", type=int, help="stop before this offset")
    p.set_defaults(func=_replay)

    p = sub.add_parser("demo", help="the built-in mixed workload under gpuledger and fifo")
    p.add_argument("--out", default="out/demo", help="where ledgers and DuckDB files go")
    p.set_defaults(func=_demo)

    p = sub.add_parser("schema", help="print the JSON Schema of a YAML input format")
    p.add_argument("kind", choices=sorted(kinds()), help="which file format")
    p.set_defaults(func=_schema)


def _cli_error(message: str) -> Exception:
    from scheduler.cli import CliError  # noqa: PLC0415  # avoid an import cycle at load time

    return CliError(message)


def _load_inputs(
    cluster: str, queues: str, workload: str
) -> tuple[ClusterFile, QueuesFile, WorkloadFile]:
    try:
        return (
            load(cluster, ClusterFile),
            load(queues, QueuesFile),
            load(workload, WorkloadFile),
        )
    except ConfigError as exc:
        raise _cli_error(str(exc)) from exc


def _fresh_dir(path: Path, force: bool) -> None:
    if path.exists() and any(path.iterdir()):
        if not force:
            raise _cli_error(f"{path} exists and is not empty (use --force to replace it)")
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)


def _progress(start: float) -> Any:
    def show(now_ms: int, submitted: int, total: int) -> None:
        print(
            f"\r  simulated {now_ms / 3_600_000:8.1f} h  jobs submitted {submitted:>7}/{total}"
            f"  ({time.perf_counter() - start:5.1f} s)",
            end="",
            file=sys.stderr,
            flush=True,
        )

    return show


def simulate_to(
    cluster: ClusterFile,
    queues: QueuesFile,
    workload: WorkloadFile,
    policy: str | PolicyConfigured,
    ledger: Path,
    *,
    show_progress: bool = False,
    observe: Any = None,
) -> Any:
    """Run a simulation into a new ledger directory; returns the SimResult."""
    from events.filelog import FileLedger  # noqa: PLC0415  # heavy imports only when used
    from replay.sim import Simulation  # noqa: PLC0415

    try:
        with FileLedger.open(ledger) as writer:
            sim = Simulation(cluster, queues, workload, policy, writer)
            progress = _progress(time.perf_counter()) if show_progress else None
            result = sim.run(progress=progress, observe=observe)
    except ConfigError as exc:
        raise _cli_error(str(exc)) from exc
    if show_progress:
        print(file=sys.stderr)
    return result


def _simulate(args: argparse.Namespace) -> int:
    cluster, queues, workload = _load_inputs(args.cluster, args.queues, args.workload)
    if args.seed is not None:
        workload = msgspec.structs.replace(workload, seed=args.seed)
    try:
        knobs = load(args.policy_file, PolicyFile) if args.policy_file else PolicyFile()
        policy = policy_event(args.policy, knobs)
    except ConfigError as exc:
        raise _cli_error(str(exc)) from exc
    ledger = Path(args.ledger)
    _fresh_dir(ledger, args.force)
    from projections.report import render_table  # noqa: PLC0415
    from replay.fairness import FairnessMonitor  # noqa: PLC0415

    monitor = None if args.no_fairness else FairnessMonitor()
    started = time.perf_counter()
    result = simulate_to(
        cluster,
        queues,
        workload,
        policy,
        ledger,
        show_progress=True,
        observe=monitor.observe if monitor is not None else None,
    )
    elapsed = time.perf_counter() - started
    print(
        f"{result.policy}: {result.jobs} jobs, {result.cycles} cycles, {result.records} ledger "
        f"records, simulated {result.end_ms / 3_600_000:.1f} h in {elapsed:.2f} s"
    )
    print("job outcomes: " + ", ".join(f"{k} {v}" for k, v in result.statuses.items()))
    print(result.gang_summary())
    if monitor is not None and monitor.rows():
        print("\nfair share under contention (queue has work waiting that free GPUs cannot hold):")
        print(render_table(monitor.rows(), list(monitor.rows()[0])))
    print(f"ledger: {ledger}")
    if args.db:
        from events.filelog import open_reader  # noqa: PLC0415
        from projections.projector import project  # noqa: PLC0415
        from projections.report import REPORT_COLUMNS, render_table, tenant_report  # noqa: PLC0415

        project(open_reader(ledger), args.db, rebuild=True)
        rows = tenant_report(args.db)
        print(render_table(rows, REPORT_COLUMNS))
    return 0


def _replay(args: argparse.Namespace) -> int:
    from events.codec import DecodeError  # noqa: PLC0415
    from events.filelog import LedgerError, open_reader  # noqa: PLC0415
    from replay.verify import run  # noqa: PLC0415

    started = time.perf_counter()
    try:
        result = run(open_reader(args.ledger), start=args.start, end=args.end)
    except (LedgerError, DecodeError, OSError) as exc:
        raise _cli_error(str(exc)) from exc
    elapsed = time.perf_counter() - started
    rate = result.records / elapsed if elapsed > 0 else 0.0
    print(
        f"replayed {result.records} records ({result.inputs} inputs, {result.decisions} "
        f"decisions in {result.cycles} cycles) in {elapsed:.2f} s, {rate:,.0f} records/s"
    )
    if result.skipped:
        print(
            f"skipped {len(result.skipped)} records of unknown types, first at offset "
            f"{result.skipped[0]}"
        )
    if not args.verify:
        return 0
    if result.mismatch is None:
        print("verify: 0 mismatches — every decision reproduced byte for byte")
        return 0
    m = result.mismatch
    where = f"offset {m.offset}" if m.offset >= 0 else "the end of the ledger"
    print(f"verify: MISMATCH at {where}")
    print(m.diff())
    return 1


def _demo(args: argparse.Namespace) -> int:
    from events.filelog import open_reader  # noqa: PLC0415
    from projections.projector import project  # noqa: PLC0415
    from projections.report import compare_reports  # noqa: PLC0415

    cluster, queues, workload = _load_inputs(
        str(EXAMPLES / "demo-cluster.yaml"),
        str(EXAMPLES / "demo-queues.yaml"),
        str(EXAMPLES / "demo-workload.yaml"),
    )
    out = Path(args.out)
    gpus = sum(g.count * g.gpus for g in cluster.nodes)
    print(
        f"gpuledger demo: {gpus} GPUs on {sum(g.count for g in cluster.nodes)} nodes, queues "
        + ", ".join(
            f"{q.name} {q.deserved_percent:g}%" if q.deserved_percent is not None else q.name
            for q in queues.queues
        )
        + f"; a {workload.horizon_s / 3600:g} h mixed workload (seed {workload.seed})"
    )
    dbs: dict[str, str] = {}
    for policy in ("gpuledger", "fifo"):
        ledger = out / policy / "ledger"
        db = out / policy / "history.duckdb"
        _fresh_dir(out / policy, force=True)
        started = time.perf_counter()
        result = simulate_to(cluster, queues, workload, policy, ledger)
        project(open_reader(ledger), str(db), rebuild=True)
        print(
            f"  {policy:<9} {result.jobs} jobs, {result.records} ledger records, "
            f"simulated {result.end_ms / 3_600_000:.1f} h in {time.perf_counter() - started:.2f} s"
            f" -> {ledger}"
        )
        dbs[policy] = str(db)
    print()
    print(compare_reports(dbs))
    print()
    print("Next:")
    print(f"  gpuledger replay --ledger {out / 'gpuledger' / 'ledger'} --verify")
    print(f"  gpuledger report --db {dbs['gpuledger']}")
    query = "SELECT * FROM tenant_percentiles"
    print(f'  gpuledger sql --db {dbs["gpuledger"]} "{query}"')
    return 0


def _schema(args: argparse.Namespace) -> int:
    print(json.dumps(json_schema(kinds()[args.kind]), indent=2))
    return 0
