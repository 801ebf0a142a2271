"""Core benchmarks at cluster scale, against issue 8's and issue 28's targets.

    python -m bench.core [--quick] [--json out/bench/core.json]

Each case runs in its own process (so its peak RSS is its own) on a state laid out by
``bench.cluster.packed`` over the 50-queue tree, under ``gpuledger`` and under ``fifo``
as a yardstick measured in the same run:

``cycle-1000``  1,000 nodes x 8 GPUs, 20,000 running pods, 5,000 pending jobs: the time of
                a cycle after one pod finished and one job arrived (p50 and p99 of 30)
``cycle-4000``  4,000 nodes, 140,000 running pods, 20,000 pending jobs: the same, and the
                process's peak RSS holding that state
``fill``        an empty 500-node cluster filled by 4,000 single-GPU jobs in one cycle
``reclaim``     one 250 x 8-GPU gang (2,000 GPUs) arriving on a full 1,000-node cluster
                in a queue under its quota: the cycle that searches for room by reclaim.
                On this layout the jobs the queues above their deserved quota may give
                do not free 250 whole nodes (each node also holds jobs that stay), so the
                gang reserves instead and says why; the figure is the search's cost
``cycle-4000-aged``  as ``cycle-4000``, with 40 steady cycles an hour after the backlog
                arrived: the victims have lost an hour of work and the heads have waited
                an hour (their lost-work budgets grown), the congested steady state; the
                40 cycles span more than one period of the victim-search back-off

The running index the policy reads (``scheduler/core/running.py``) is built before the
timed part, as a scheduler builds it once per process or restored snapshot (``apply``
keeps it current from then on); its build time is printed under the table.

Nothing asserts: figures, their targets and ratios (target / figure for times, figure /
target for rates; >= 1 meets the target) are printed as a table and written as JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from bench.cluster import packed, running_pods, tree
from bench.measure import nearest_rank, provenance
from events.model import JobPreempted, JobSubmitted, PodFinished, PodSpec, QueueConfigured
from scheduler.core import State, apply, cycle
from scheduler.render.table import render_table

POLICIES = ("gpuledger", "fifo")


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _timed(state: State, now: int) -> tuple[float, list[Any]]:
    gc.disable()
    started = time.perf_counter()
    decisions = cycle(state, now)
    elapsed = time.perf_counter() - started
    gc.enable()
    return elapsed, decisions


def steady_cycles(state: State, count: int, age_ms: int = 0) -> list[float]:
    """Seconds per cycle, each after one finished pod and one new submission, starting
    ``age_ms`` after the state was laid out."""
    rng = random.Random(11)
    now = state.now + 1000 + age_ms
    cycle(state, now)  # the first cycle checks every arrival once: not the steady state
    running = sorted(j.job for j in state.jobs.values() if j.live())
    leaves = [q.name for q in state.leaf_queues()]
    out: list[float] = []
    for i in range(count):
        now += 1000
        job = state.jobs.get(rng.choice(running))  # an ended job leaves State.jobs
        live = job.live() if job is not None else []
        if job is not None and live:
            apply(state, PodFinished(job=job.job, pod=live[0].pod), now)
        pod = PodSpec(name=f"new-{i}-0", gpu_milli=rng.choice((250, 1000, 8000)))
        apply(state, JobSubmitted(job=f"new-{i}", queue=rng.choice(leaves), pods=(pod,)), now)
        elapsed, _ = _timed(state, now)
        out.append(elapsed)
    return out


def index_seconds(state: State) -> float:
    """Build the running index (``scheduler/core/running.py``) as a scheduler does once per
    process or restored snapshot; ``apply`` keeps it current from then on."""
    started = time.perf_counter()
    state.running_index()
    return time.perf_counter() - started


def case_cycle(
    nodes: int, pods: int, pending: int, policy: str, count: int, age_ms: int = 0
) -> dict[str, Any]:
    t0 = time.perf_counter()
    state = packed(nodes, pods, pending, policy)
    built = time.perf_counter() - t0
    index_s = index_seconds(state)
    times = steady_cycles(state, count, age_ms)
    return {
        "nodes": len(state.nodes),
        "running_pods": running_pods(state),
        "pending_jobs": len(state.pending),
        "p50_ms": 1000 * statistics.median(times),
        "p99_ms": 1000 * nearest_rank(sorted(times), 0.99),
        "built_s": built,
        "index_s": index_s,
        "rss_mib": peak_rss_mib(),
    }


def case_fill(nodes: int, jobs: int, policy: str) -> dict[str, Any]:
    state = packed(nodes, 0, 0, policy, free_share=1.0, gang_nodes=0.0)
    leaves = [q.name for q in state.leaf_queues()]
    for i in range(jobs):
        pod = PodSpec(name=f"f{i}-0", gpu_milli=1000)
        apply(state, JobSubmitted(job=f"f{i}", queue=leaves[i % len(leaves)], pods=(pod,)), 1)
    elapsed, decisions = _timed(state, 2)
    placed = sum(len(j.live()) for j in state.jobs.values())
    return {"placed": placed, "seconds": elapsed, "per_s": placed / elapsed,
            "decisions": len(decisions)}  # fmt: skip


def reclaim_queues() -> list[QueueConfigured]:
    """The 50-queue tree at 14 % per organisation, beside ``flagship`` deserving 30 %."""
    queues = [
        msgspec.structs.replace(q, deserved_gpu_percent=14) if not q.parent else q for q in tree()
    ]
    return [*queues, QueueConfigured(queue="flagship", deserved_gpu_percent=30)]


def case_reclaim(nodes: int, gang_pods: int, policy: str) -> dict[str, Any]:
    state = packed(
        nodes, nodes * 20, 0, policy, free_share=0.0, queues=reclaim_queues(), idle=("flagship",)
    )
    now = state.now + 1000
    cycle(state, now)
    index_s = index_seconds(state)
    now += 1000
    pods = tuple(PodSpec(name=f"flag-{k}", gpu_milli=8000) for k in range(gang_pods))
    apply(state, JobSubmitted(job="flag", queue="flagship", pods=pods), now)
    elapsed, decisions = _timed(state, now)
    victims = [d for d in decisions if isinstance(d, JobPreempted)]
    flag = state.jobs["flag"]
    return {
        "gang_gpus": gang_pods * 8,
        "running_pods_before": nodes * 20,
        "seconds": elapsed,
        "victims": len(victims),
        "victim_pods": sum(len(v.pods) for v in victims),
        "gang_placed": len(flag.placements) == gang_pods,
        "index_s": index_s,
    }


CASES = ("cycle-1000", "cycle-4000", "fill", "reclaim", "cycle-4000-aged")


def run_case(name: str, policy: str, scale: float) -> dict[str, Any]:
    def n(x: int) -> int:
        return max(1, int(x * scale))

    match name:
        case "cycle-1000":
            return case_cycle(n(1000), n(20000), n(5000), policy, 30)
        case "cycle-4000":
            return case_cycle(n(4000), n(140000), n(20000), policy, 20)
        case "fill":
            return case_fill(n(500), n(4000), policy)
        case "reclaim":
            return case_reclaim(n(1000), n(250), policy)
        case "cycle-4000-aged":
            # 40 cycles a second apart: more than one period of the victim-search back-off
            # (30 s), so every starved head's search falls in the sample
            return case_cycle(n(4000), n(140000), n(20000), policy, 40, age_ms=3_600_000)
    raise SystemExit(f"unknown case {name!r}; choose from {', '.join(CASES)}")


def _in_subprocess(name: str, policy: str, quick: bool) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.core", "--case", name, "--policy", policy]
    if quick:
        cmd.append("--quick")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def figures(results: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The issue's figures: (what, gpuledger, fifo, target, ratio, unit)."""
    rows: list[dict[str, Any]] = []

    def add(what: str, key: str, case: str, target: float, unit: str, rate: bool) -> None:
        ours = results[case]["gpuledger"][key]
        fifo = results[case]["fifo"].get(key)
        ratio = ours / target if rate else target / max(ours, 1e-9)
        rows.append({"figure": what, "gpuledger": ours, "fifo": fifo, "target": target,
                     "unit": unit, "ratio": ratio, "meets": ratio >= 1})  # fmt: skip

    c1, c4 = results["cycle-1000"]["gpuledger"], results["cycle-4000"]["gpuledger"]
    shape1 = f"{c1['nodes']} nodes, {c1['running_pods']} pods, {c1['pending_jobs']} pending"
    shape4 = f"{c4['nodes']} nodes, {c4['running_pods']} pods, {c4['pending_jobs']} pending"
    add(f"cycle p50 ({shape1})", "p50_ms", "cycle-1000", 50, "ms", False)
    add(f"cycle p99 ({shape1})", "p99_ms", "cycle-1000", 300, "ms", False)
    add(f"cycle p50 ({shape4})", "p50_ms", "cycle-4000", 250, "ms", False)
    add(f"cycle p99 ({shape4})", "p99_ms", "cycle-4000", 400, "ms", False)
    fifo4 = results["cycle-4000"]["fifo"]["p50_ms"]
    times_fifo = c4["p50_ms"] / max(fifo4, 1e-9)
    rows.append({"figure": f"cycle p50 ÷ fifo's p50 ({c4['nodes']} nodes)",
                 "gpuledger": times_fifo, "fifo": 1.0, "target": 10, "unit": "x",
                 "ratio": 10 / times_fifo, "meets": times_fifo <= 10})  # fmt: skip
    growth = c4["p50_ms"] / max(c1["p50_ms"], 1e-9)
    rows.append({"figure": f"cycle p50 at {c4['nodes']} nodes ÷ at {c1['nodes']}",
                 "gpuledger": growth, "fifo": None, "target": 5, "unit": "x",
                 "ratio": 5 / growth, "meets": growth <= 5})  # fmt: skip
    add(f"cycle p50, backlog aged 1 h ({shape4})", "p50_ms", "cycle-4000-aged", 250, "ms", False)
    add(f"cycle p99, backlog aged 1 h ({shape4})", "p99_ms", "cycle-4000-aged", 400, "ms", False)
    add(f"peak RSS holding {shape4}", "rss_mib", "cycle-4000", 1024, "MiB", False)
    fill = results["fill"]["gpuledger"]
    add(f"fill: {fill['placed']} placements on an empty cluster", "per_s", "fill", 5000,
        "placements/s", True)  # fmt: skip
    rec = results["reclaim"]["gpuledger"]
    add(
        f"reclaim for a {rec['gang_gpus']}-GPU gang on a full cluster "
        f"({rec['victims']} victims, placed: {rec['gang_placed']})",
        "seconds", "reclaim", 1.0, "s", False,
    )  # fmt: skip
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.core")
    parser.add_argument("--quick", action="store_true", help="a fifth of every size")
    parser.add_argument("--case", choices=CASES, help="run one case here, print JSON")
    parser.add_argument("--policy", default="gpuledger", choices=POLICIES)
    parser.add_argument("--json", type=Path, default=Path("out/bench/core.json"))
    args = parser.parse_args(argv)
    scale = 0.2 if args.quick else 1.0
    if args.case:
        print(json.dumps(run_case(args.case, args.policy, scale)))
        return 0
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for name in CASES:
        results[name] = {}
        for policy in POLICIES:
            started = time.perf_counter()
            results[name][policy] = _in_subprocess(name, policy, args.quick)
            took = time.perf_counter() - started
            print(f"  {name} [{policy}] done in {took:.0f} s", file=sys.stderr, flush=True)
    rows = figures(results)
    shown = [
        {
            "figure": r["figure"],
            "gpuledger": f"{r['gpuledger']:,.1f} {r['unit']}",
            "fifo": "" if r["fifo"] is None else f"{r['fifo']:,.1f} {r['unit']}",
            "target": f"{'>=' if r['unit'] == 'placements/s' else '<='} {r['target']:,}",
            "ratio": f"{r['ratio']:.2f}",
            "meets": "yes" if r["meets"] else "NO",
        }
        for r in rows
    ]
    print(render_table(shown, ["figure", "gpuledger", "fifo", "target", "ratio", "meets"]))
    ours = [results[case]["gpuledger"] for case in ("cycle-1000", "cycle-4000")]
    builds = ", ".join(f"{r['nodes']:,} nodes {r['index_s']:.2f} s" for r in ours)
    print(f"running index, built once per process or restore (not in the times above): {builds}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps({"figures": rows, "cases": results, "provenance": provenance()}, indent=2)
    )
    print(f"(JSON: {args.json})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
