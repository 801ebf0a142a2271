"""Run the benchmarks and print a table and JSON: figure, target, ratio (>= 1 meets it).

    python -m bench [--quick] [--json out/bench.json]

Each figure is measured in this run; the ``fifo`` policy is run on the same input as a
yardstick. Tests never assert on these numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from events.memlog import MemoryLedger
from replay.config import ClusterFile, QueuesFile, WorkloadFile, parse
from replay.sim import Simulation
from scheduler.core import State
from scheduler.fold.state_at import fold as fold_ledger
from scheduler.fold.verify import run as replay

MONTH_CLUSTER = "nodes:\n  - {name: n, count: 125, gpus: 8}\n"  # 1,000 GPUs
MONTH_QUEUES = """queues:
  - {name: org, deserved_percent: 80}
  - {name: t1, parent: org, deserved_percent: 50}
  - {name: t2, parent: org, deserved_percent: 50}
  - {name: adhoc, deserved_percent: 20}
"""
MONTH_WORKLOAD = """seed: 1
horizon_s: 2592000
generators:
  - {name: a, queue: t1, arrival: {type: poisson, rate_per_h: 50},
     gang_size: {type: choice, values: [1, 2, 4]},
     gpus_per_pod: {type: choice, values: [1, 2, 4, 8]},
     runtime_s: {type: lognormal, median: 1800, sigma: 1.0, max: 86400}, checkpoint_interval_s: 600}
  - {name: b, queue: t2, arrival: {type: poisson, rate_per_h: 50},
     gpus_per_pod: {type: choice, values: [0.5, 1, 2]},
     runtime_s: {type: lognormal, median: 1200, sigma: 0.8}}
  - {name: c, queue: adhoc, arrival: {type: poisson, rate_per_h: 40}, gpus_per_pod: 1,
     runtime_s: {type: exponential, mean: 900}, priority_class: build}
"""


def _simulate(policy: str, scale: float) -> tuple[dict[str, Any], MemoryLedger]:
    workload = parse(MONTH_WORKLOAD, WorkloadFile)
    if scale != 1.0:
        import msgspec  # noqa: PLC0415

        workload = msgspec.structs.replace(workload, horizon_s=workload.horizon_s * scale)
    ledger = MemoryLedger()
    sim = Simulation(
        parse(MONTH_CLUSTER, ClusterFile), parse(MONTH_QUEUES, QueuesFile), workload, policy, ledger
    )
    started = time.perf_counter()

    def progress(now_ms: int, submitted: int, total: int) -> None:
        print(
            f"\r  {policy}: simulated {now_ms / 86_400_000:5.1f} days, {submitted}/{total} jobs "
            f"({time.perf_counter() - started:5.1f} s)",
            end="",
            file=sys.stderr,
            flush=True,
        )

    result = sim.run(progress=progress, progress_every=50_000)
    elapsed = time.perf_counter() - started
    print(file=sys.stderr)
    return {
        "policy": policy,
        "jobs": result.jobs,
        "records": result.records,
        "cycles": result.cycles,
        "seconds": elapsed,
    }, ledger


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--quick", action="store_true", help="a tenth of the month")
    parser.add_argument("--json", default="out/bench.json", help="where to write the figures")
    parser.add_argument("--kafka", action="store_true", help="also the live path on the broker")
    args = parser.parse_args(argv)
    scale = 0.1 if args.quick else 1.0
    rows: list[dict[str, Any]] = []

    ours, ledger = _simulate("gpuledger", scale)
    fifo, fifo_ledger = _simulate("fifo", scale)
    target_s = 60.0 * scale
    rows.append(
        {
            "benchmark": f"simulate {ours['jobs']:,} jobs on 1,000 GPUs ({30 * scale:g} days)",
            "figure": f"{ours['seconds']:.1f} s",
            "target": f"<= {target_s:g} s",
            "ratio": target_s / ours["seconds"],
            "fifo": f"{fifo['seconds']:.1f} s",
            "detail": f"{ours['cycles'] / ours['seconds']:,.0f} cycles/s",
        }
    )
    rows += replay_rows(ledger, fifo_ledger)
    del fifo_ledger  # a million records the projection below need not share memory with
    from bench.projection import long_rows  # noqa: PLC0415  # DuckDB bench
    from bench.projection import rows as projection_rows  # noqa: PLC0415

    rows += projection_rows(ledger)  # the month's first 1,000,000 events into DuckDB
    rows += long_rows()  # a quiet 4,000-hour, 22-queue ledger
    if args.kafka:
        from bench.kafka_bench import rows as kafka_rows  # noqa: PLC0415  # needs the broker

        rows += kafka_rows(args.quick)
    widths = {k: max(len(k), *(len(_cell(r[k])) for r in rows)) for k in rows[0]}
    print("  ".join(k.ljust(widths[k]) for k in rows[0]))
    for row in rows:
        print("  ".join(_cell(row[k]).ljust(widths[k]) for k in row))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    print(f"\nwrote {args.json}")
    return 0


def fold(ledger: MemoryLedger) -> tuple[State, int, float]:
    """Decode and apply every record of ``ledger`` to a fresh state with ``state --at``'s
    fold (decisions applied as recorded, no cycle re-run): (state, records, seconds)."""
    started = time.perf_counter()
    state, last = fold_ledger(ledger)
    return state, last + 1, time.perf_counter() - started


def _replay_seconds(ledger: MemoryLedger) -> tuple[int, float, int, int, float]:
    """(records, fold seconds, verified records, cycles re-run, verify seconds)."""
    _, records, fold_s = fold(ledger)
    started = time.perf_counter()
    result = replay(ledger)
    verify_s = time.perf_counter() - started
    assert result.ok, "the benchmark ledger must replay"
    return records, fold_s, result.records, result.cycles, verify_s


def replay_rows(ledger: MemoryLedger, fifo: MemoryLedger) -> list[dict[str, Any]]:
    """Issue 8's two replay targets: >= 50,000 events/s decoded and applied, and a verify
    (which re-runs every recorded cycle as well) of a million-event ledger in under a minute,
    scaled to the ledger's size; the same for the ``fifo`` run's ledger as a yardstick."""
    records, fold_s, verified, cycles, verify_s = _replay_seconds(ledger)
    f_records, f_fold_s, f_verified, _, f_verify_s = _replay_seconds(fifo)
    target_s = 60.0 * verified / 1_000_000
    return [
        {
            "benchmark": f"decode + apply {records:,} ledger events (as state --at)",
            "figure": f"{records / fold_s:,.0f} events/s",
            "target": ">= 50,000 events/s",
            "ratio": records / fold_s / 50_000,
            "fifo": f"{f_records / f_fold_s:,.0f} events/s",
            "detail": f"{fold_s:.1f} s",
        },
        {
            "benchmark": f"replay --verify of {verified:,} ledger events ({cycles:,} cycles)",
            "figure": f"{verify_s:.1f} s",
            "target": f"<= {target_s:.0f} s (1 min per 1M)",
            "ratio": target_s / verify_s,
            "fifo": f"{f_verify_s:.1f} s ({f_verified:,} events)",
            "detail": f"{verified / verify_s:,.0f} events/s",
        },
    ]


def _cell(value: Any) -> str:
    return f"{value:.2f}x" if isinstance(value, float) else str(value)


if __name__ == "__main__":
    sys.exit(main())
