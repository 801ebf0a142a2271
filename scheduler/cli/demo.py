"""``gpuledger demo``: the built-in mixed workload under gpuledger and fifo, projected and
compared (what ``make demo`` runs).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from events.ledgertime import format_duration
from scheduler.cli.common import fresh_dir, load_inputs, simulate_into
from scheduler.cli.errors import refuse_kafka_url

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``gpuledger demo`` to the ``gpuledger`` parser."""
    p = sub.add_parser("demo", help="the built-in mixed workload under gpuledger and fifo")
    p.add_argument("--out", default="out/demo", help="where ledgers and DuckDB files go")
    p.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    from events.sources import open_reader  # noqa: PLC0415
    from projections.projector import project  # noqa: PLC0415
    from projections.report import compare_reports  # noqa: PLC0415

    refuse_kafka_url(args.out, "--out", "demo", "a directory for the ledgers and databases")
    from replay.examples import EXAMPLES  # noqa: PLC0415

    demo = EXAMPLES["demo"]
    cluster, queues, workload = load_inputs(
        str(demo.path("cluster")), str(demo.path("queues")), str(demo.path("workload"))
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
        fresh_dir(out / policy, force=True)
        started = time.perf_counter()
        result = simulate_into(cluster, queues, workload, policy, ledger)
        project(open_reader(ledger), str(db), rebuild=True)
        print(
            f"  {policy:<9} {result.jobs} jobs, {result.records} ledger records, "
            f"simulated {format_duration(result.end_ms / 1000)} in "
            f"{format_duration(time.perf_counter() - started)}"
            f" -> {ledger}"
        )
        dbs[policy] = str(db)
    print()
    print(compare_reports(dbs))
    print()
    print("Next:")
    exe = _runnable_name()
    print(f"  {exe} replay --ledger {out / 'gpuledger' / 'ledger'} --verify")
    print(f"  {exe} report --db {dbs['gpuledger']}")
    query = "SELECT * FROM tenant_percentiles"
    print(f'  {exe} sql --db {dbs["gpuledger"]} "{query}"')
    print(f"  {exe} serve --ledger {out / 'gpuledger' / 'ledger'}   # the live web console")
    return 0


def _runnable_name() -> str:
    """How to type this command so that it runs from here: ``gpuledger`` when that is the
    one on PATH, else the path it was started by (``.venv/bin/gpuledger`` after
    ``make demo``, whose virtualenv is not activated)."""
    started = Path(sys.argv[0])
    on_path = shutil.which("gpuledger")
    if started.name != "gpuledger" or (
        on_path is not None and Path(on_path).resolve() == started.resolve()
    ):
        return "gpuledger"
    try:
        return str(started.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(started.resolve())
