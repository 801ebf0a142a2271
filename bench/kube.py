"""Pods bound per second through the real kube-apiserver: a 500-node, 4,000-pod fill.

    python -m bench.kube [--nodes 500] [--pods 4000] [--json out/bench-kube.json]

Brings up scripts/k8s.sh's control plane, creates ``--nodes`` kwok nodes of 8 GPUs and one
queue, starts the ingestor, the embedded scheduler and the binder as subprocesses (as in
production), creates ``--pods`` one-GPU pods from a thread pool and waits until every pod is
bound. Reported: the fill's wall time (first pod created → last pod bound), pods bound per
second over it, and the binder's own rate (first → last ``PodBound``). KAI-Scheduler's
published scale test took 6 min 37 s (397 s) for this fill on its infrastructure.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from events.codec import decode_event
from events.filelog import LedgerDirReader
from events.model import PodBound

KAI_SECONDS = 397.0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the fill and print the figures."""
    from tests.kubeharness import gpuledger, make_cluster, wait_until  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog="python -m bench.kube")
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=4000)
    parser.add_argument("--json", default="out/bench-kube.json")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="gpuledger-bench-kube-"))
    cluster = make_cluster(work)
    cluster.reset()
    ns = cluster.namespace("bench")
    t = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        for i in range(0, args.nodes, 50):
            list(
                pool.map(
                    lambda j: cluster.nodes(f"bench-gpu-{j}", 1, gpus=8),
                    range(i, min(i + 50, args.nodes)),
                )
            )
    print(f"{args.nodes} nodes created in {time.perf_counter() - t:.1f}s", file=sys.stderr)
    cluster.queue("bench", [ns], quota=8 * args.nodes)
    binder_intake = work / "intake" / "binder"

    def bound() -> int:
        if not binder_intake.is_dir() or not any(binder_intake.glob("*.seg")):
            return 0
        return LedgerDirReader(binder_intake).end_offset()

    with gpuledger(cluster, work):
        wait_until((work / "intake" / "ingest").is_dir, 30, "the ingestor")
        time.sleep(2)  # let the ingestor register the nodes first
        start = time.perf_counter()
        with ThreadPoolExecutor(16) as pool:
            list(
                pool.map(
                    lambda i: cluster.pod(ns, f"fill-{i:05d}", gpus=1, duration=None),
                    range(args.pods),
                )
            )
        created = time.perf_counter() - start
        print(f"{args.pods} pods created in {created:.1f}s", file=sys.stderr)
        wait_until(lambda: bound() >= args.pods, 1800, "every pod bound")
        fill = time.perf_counter() - start
    stamps = [
        env.at
        for off, env in LedgerDirReader(binder_intake).read()
        if isinstance(decode_event(env, off), PodBound)
    ]
    binder_s = (max(stamps) - min(stamps)) / 1000 or 1e-3
    row = {
        "figure": "kube fill: pods bound/s (real kube-apiserver, kwok nodes)",
        "nodes": args.nodes,
        "pods": args.pods,
        "pods_bound": len(stamps),
        "pod_create_s": round(created, 1),
        "fill_s": round(fill, 1),
        "pods_per_s": round(len(stamps) / fill, 1),
        "binder_pods_per_s": round(len(stamps) / binder_s, 1),
        "kai_published_s": KAI_SECONDS,
        "ratio_vs_kai": round(KAI_SECONDS / fill, 2),
    }
    for k, v in row.items():
        print(f"{k:>18}: {v}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps([row], indent=2) + "\n")
    cluster.reset()
    return 0


if __name__ == "__main__":
    sys.exit(main())
