"""Scheduling-cycle benchmarks on the pure core with realistic state (issue 8's targets).

    python -m bench.core [--quick]

Builds a cluster (nodes x 8 GPUs), a 3-level tree of 50 queues, running pods and pending
jobs through the core itself, then times cycles that follow one new submission and one
finished pod each, under ``gpuledger`` and ``fifo``.
"""

from __future__ import annotations

import argparse
import gc
import random
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from events.model import (
    JobSubmitted,
    NodeRegistered,
    PodFinished,
    PodSpec,
    PodStarted,
    QueueConfigured,
)
from replay.config import policy_event
from scheduler.core import State, apply, cycle


def tree() -> list[QueueConfigured]:
    """5 top queues x 3 departments x 2 or 3 teams: 50 queues, 32 leaves."""
    queues: list[QueueConfigured] = []
    leaves = 0
    for t in range(5):
        top = f"org{t}"
        queues.append(QueueConfigured(queue=top, deserved_gpu_percent=20, over_quota_weight=1))
        for d in range(3):
            dept = f"{top}-d{d}"
            queues.append(QueueConfigured(queue=dept, parent=top, deserved_gpu_percent=30))
            for k in range(2 if (t + d) % 2 else 3):
                if len(queues) >= 50:
                    break
                queues.append(
                    QueueConfigured(
                        queue=f"{dept}-t{k}", parent=dept, deserved_gpu_percent=33,
                        over_quota_weight=1 + k,
                    )
                )  # fmt: skip
                leaves += 1
    return queues[:50]


def build(nodes: int, running_pods: int, pending_jobs: int, policy: str) -> tuple[State, list[str]]:
    """A state with ``running_pods`` placed and ``pending_jobs`` waiting."""
    rng = random.Random(7)
    state = State()
    apply(state, policy_event(policy), 0)
    for q in tree():
        apply(state, q, 0)
    for i in range(nodes):
        apply(state, NodeRegistered(node=f"n{i:05d}", gpus=8, labels={"rack": f"r{i // 32}"}), 0)
    leaves = [q.name for q in state.leaf_queues()]
    now = 1000
    placed = 0
    seq = 0
    # fill: submit single- and few-pod jobs and let cycles place them
    while placed < running_pods:
        batch = []
        for _ in range(200):
            size = rng.choice((1, 1, 1, 2, 4))
            gpus = rng.choice((250, 250, 500, 500, 1000))
            seq += 1
            batch.append(
                JobSubmitted(
                    job=f"run-{seq}", queue=rng.choice(leaves),
                    pods=tuple(PodSpec(name=f"run-{seq}-{k}", gpu_milli=gpus) for k in range(size)),
                    expected_runtime_ms=rng.randint(600, 36000) * 1000,
                )
            )  # fmt: skip
        for event in batch:
            apply(state, event, now)
        cycle(state, now)
        before = placed
        placed = sum(len(j.placements) for j in state.jobs.values())
        if placed == before:
            break
        now += 1000
    for job in list(state.jobs.values()):
        for pod in job.placements:
            apply(state, PodStarted(job=job.job, pod=pod), now)
    # pending: too big to fit now
    for i in range(pending_jobs):
        size = rng.choice((1, 2, 4, 8))
        apply(
            state,
            JobSubmitted(
                job=f"wait-{i}", queue=rng.choice(leaves),
                pods=tuple(PodSpec(name=f"wait-{i}-{k}", gpu_milli=8000) for k in range(size)),
                expected_runtime_ms=3_600_000,
            ),
            now,
        )  # fmt: skip
    cycle(state, now)
    running = [j.job for j in state.jobs.values() if j.placements]
    return state, running


def time_cycles(state: State, running: list[str], count: int) -> list[float]:
    """Seconds per cycle, each after one finished pod and one new submission."""
    rng = random.Random(11)
    now = state.now + 1000
    out: list[float] = []
    for i in range(count):
        job = state.jobs[rng.choice(running)]
        if job.placements:
            pod = next(iter(job.placements))
            apply(state, PodFinished(job=job.job, pod=pod), now)
        leaves = [q.name for q in state.leaf_queues()]
        apply(
            state,
            JobSubmitted(job=f"new-{i}", queue=rng.choice(leaves),
                         pods=(PodSpec(name=f"new-{i}-0", gpu_milli=1000),)),
            now,
        )  # fmt: skip
        gc.disable()
        started = time.perf_counter()
        cycle(state, now)
        out.append(time.perf_counter() - started)
        gc.enable()
        now += 1000
    return out


def fill_rate(nodes: int, jobs: int) -> float:
    """Placements per second filling an empty cluster with single-GPU jobs in one cycle."""
    state = State()
    apply(state, policy_event("gpuledger"), 0)
    for q in tree():
        apply(state, q, 0)
    for i in range(nodes):
        apply(state, NodeRegistered(node=f"n{i:05d}", gpus=8), 0)
    leaves = [q.name for q in state.leaf_queues()]
    for i in range(jobs):
        apply(
            state,
            JobSubmitted(job=f"f{i}", queue=leaves[i % len(leaves)],
                         pods=(PodSpec(name=f"f{i}-0", gpu_milli=1000),)),
            0,
        )  # fmt: skip
    started = time.perf_counter()
    decisions = cycle(state, 1)
    elapsed = time.perf_counter() - started
    return (len(decisions) - 1) / elapsed


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.core")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    scale = 0.2 if args.quick else 1.0
    rows: list[dict[str, Any]] = []
    for policy in ("gpuledger", "fifo"):
        t0 = time.perf_counter()
        state, running = build(int(1000 * scale), int(20000 * scale), int(5000 * scale), policy)
        built = time.perf_counter() - t0
        times = time_cycles(state, running, 30)
        rows.append(
            {
                "benchmark": f"cycle, {len(state.nodes)} nodes, "
                f"{sum(len(j.placements) for j in state.jobs.values())} running pods, "
                f"{len(state.pending)} pending jobs",
                "policy": policy,
                "p50_ms": 1000 * statistics.median(times),
                "p99_ms": 1000 * percentile(times, 0.99),
                "built_s": built,
            }
        )
        print(rows[-1], file=sys.stderr)
    rate = fill_rate(int(500 * scale) or 1, int(4000 * scale))
    print(f"fill: {rate:,.0f} placements/s (target >= 5,000)")
    for row in rows:
        print(
            f"{row['benchmark']} [{row['policy']}]: p50 {row['p50_ms']:.1f} ms "
            f"(target <= 100, ratio {100 / row['p50_ms']:.2f}), p99 {row['p99_ms']:.1f} ms "
            f"(target <= 300, ratio {300 / row['p99_ms']:.2f}); built in {row['built_s']:.1f} s"
        )
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"max RSS {rss:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
