"""The policy on a congested multi-tenant workload, against the baselines (issue 15's yardsticks).

    python -m bench.policy [--out DIR] [--policies gpuledger,easy,fifo,drf] [--json FILE]

Runs ``gpuledger compare`` on ``bench/multitenant/`` (a week of six tenants on 320 GPUs:
mostly 1-GPU jobs with heavy-tailed runtimes and 16–32-GPU gangs, demand close to capacity)
and prints its per-policy and per-queue tables; then the figures with targets: gpuledger's
average wait against EASY backfill's, its lost work as a share of allocated GPU time, the
minutes GPUs sat idle while a fitting job waited, the time the gpuledger simulation took,
and the rate ``replay --verify`` checks its ledger at. Tests never assert on these numbers.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from events.filelog import LedgerDirReader
from replay.compare import compare, demand_table, summary_table
from replay.config import ClusterFile, QueuesFile, WorkloadFile, load
from replay.verify import run as verify

HERE = Path(__file__).parent / "multitenant"


def measure(out: Path, policies: Sequence[str]) -> dict[str, Any]:
    """Compare the policies on the workload (into fresh ledgers); verify gpuledger's."""
    for policy in policies:
        shutil.rmtree(out / policy, ignore_errors=True)
    runs = compare(
        load(HERE / "cluster.yaml", ClusterFile),
        load(HERE / "queues.yaml", QueuesFile),
        load(HERE / "workload.yaml", WorkloadFile),
        policies,
        out,
    )
    print(summary_table(runs))
    print()
    print(demand_table(runs))
    by = {run.policy: run for run in runs}
    figures: dict[str, Any] = {p: {**r.summary, "sim_s": r.seconds} for p, r in by.items()}
    mine = by.get("gpuledger")
    if mine is not None:
        started = time.perf_counter()
        result = verify(LedgerDirReader(mine.ledger))
        seconds = time.perf_counter() - started
        assert result.ok, result.mismatch and result.mismatch.diff()
        figures["verify_records_per_s"] = result.records / seconds
    return figures


def targets(figures: dict[str, Any]) -> list[tuple[str, float, float, bool]]:
    """(figure, value, target, met) for the issue's goals that this run can judge."""
    rows: list[tuple[str, float, float, bool]] = []
    mine = figures.get("gpuledger")
    if mine is None:
        return rows
    easy = figures.get("easy")
    if easy is not None and easy["wait_avg_s"]:
        ratio = mine["wait_avg_s"] / easy["wait_avg_s"]
        rows.append(("avg wait / easy's", ratio, 1.0, ratio <= 1.0))
    rows.append(("lost % of allocated GPU time", 100 * mine["lost_share"], 2.0,
                 100 * mine["lost_share"] <= 2.0))  # fmt: skip
    rows.append(("idle-fit minutes", mine["idle_fit_min"], 0.0, mine["idle_fit_min"] == 0))
    rows.append(("gpuledger simulation, s", mine["sim_s"], 60.0, mine["sim_s"] <= 60.0))
    rate = figures.get("verify_records_per_s", 0.0)
    rows.append(("replay --verify, records/s", rate, 50_000.0, rate >= 50_000.0))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.policy")
    parser.add_argument("--out", default="out/bench-policy", help="the ledgers")
    parser.add_argument("--policies", default="gpuledger,easy,fifo,drf")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    policies = [p for p in args.policies.split(",") if p]
    figures = measure(Path(args.out), policies)
    print()
    print(f"{'figure':<32} {'value':>12} {'target':>10}  met")
    for name, value, target, met in targets(figures):
        print(f"{name:<32} {value:>12.2f} {target:>10.2f}  {'yes' if met else 'no'}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
