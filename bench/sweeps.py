"""A generated Helios-style trace: many tenants, sweeps of like jobs, gangs asking for CPU.

    python -m bench.sweeps OUT.csv [--jobs N] [--gpus G] [--load X] [--seed S]

Writes a ``cluster_log.csv`` in the Helios dataset's columns (``job_id, user, vc, gpu_num,
cpu_num, node_num, state, submit_time, start_time, end_time, duration``), so it goes
through ``gpuledger trace import --format helios`` like the real one. The workload has
the features of public multi-tenant GPU traces (Helios, Philly) that the shared Alibaba
trace lacks:

* tenants (``vc``) of skewed size (Zipf-like weights);
* job sizes of 1 (most), 2, 4, 8, 16, 32 and 64 GPUs, multi-node jobs as 8-GPU pods;
* 4 cores per GPU, so every multi-node job is a gang of pods asking for CPU (the import
  splits ``cpu_num`` over the pods);
* sweeps: 15 % of submissions are bursts of 5–40 like jobs from one tenant within
  seconds (hyper-parameter searches);
* log-normal run times (median 15 min x (1 + log2 GPUs)), a quarter of them short
  failed or debug runs, capped at 2 days;
* arrivals with a daily cycle, paced so that the GPU time submitted is ``load`` times
  what the cluster offers over the span of submissions.

It is generated, not real: it stands in for the holdout traces' shape so the bench can
show the policy on it (``bench.policy``'s ``sweeps`` run). ``random.Random(seed)`` makes
it the same file on every machine.
"""

from __future__ import annotations

import argparse
import csv
import math
import random
from collections.abc import Sequence
from pathlib import Path

SIZES = ((1, 0.70), (2, 0.07), (4, 0.10), (8, 0.08), (16, 0.03), (32, 0.015), (64, 0.005))
"""GPUs per job, with their shares of submissions."""

MAX_RUNTIME_S = 2 * 86_400
COLUMNS = (
    "job_id",
    "user",
    "vc",
    "gpu_num",
    "cpu_num",
    "node_num",
    "state",
    "submit_time",
    "start_time",
    "end_time",
    "duration",
)


def _size(rng: random.Random) -> int:
    x = rng.random()
    for gpus, share in SIZES:
        if x < share:
            return gpus
        x -= share
    return 1


def _runtime(rng: random.Random, gpus: int) -> int:
    median = 900 * (1 + math.log2(gpus))
    seconds = rng.lognormvariate(math.log(median), 1.8)
    if rng.random() < 0.25:
        seconds = rng.uniform(5, 120)  # a failed or debug run
    return max(1, min(int(seconds), MAX_RUNTIME_S))


def generate(
    jobs: int = 5000, gpus: int = 640, load: float = 1.3, tenants: int = 11, seed: int = 3
) -> list[dict[str, object]]:
    """The trace's rows, in submission order."""
    rng = random.Random(seed)
    weights = [1 / (i + 1) ** 1.1 for i in range(tenants)]
    drawn: list[tuple[int, int, int]] = []  # (tenant, GPUs, run time)
    while len(drawn) < jobs:
        tenant = rng.choices(range(tenants), weights)[0]
        burst = rng.randint(5, 40) if rng.random() < 0.15 else 1
        size = _size(rng)
        for _ in range(min(burst, jobs - len(drawn))):
            drawn.append((tenant, size, _runtime(rng, size)))
    work = sum(size * runtime for _, size, runtime in drawn)
    mean_gap = work / (gpus * load) / len(drawn)
    rows: list[dict[str, object]] = []
    at = 0.0
    previous: tuple[int, int] | None = None
    for index, (tenant, size, runtime) in enumerate(drawn):
        if previous == (tenant, size) and rng.random() < 0.9:
            at += rng.uniform(0, 5)  # the next job of a sweep
        else:
            hour = (at / 3600) % 24
            at += rng.expovariate((1 + 0.6 * math.sin((hour - 6) / 24 * 2 * math.pi)) / mean_gap)
        previous = (tenant, size)
        rows.append(
            {
                "job_id": f"j{index}",
                "user": f"u{tenant}-{index % 3}",
                "vc": f"vc{tenant:02d}",
                "gpu_num": size,
                "cpu_num": size * 4,
                "node_num": max(1, size // 8),
                "state": "COMPLETED",
                "submit_time": int(at),
                "start_time": "",
                "end_time": "",
                "duration": runtime,
            }
        )
    return rows


def write(path: Path, rows: list[dict[str, object]]) -> None:
    """Write the rows as a Helios ``cluster_log.csv``."""
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sweeps")
    parser.add_argument("out", type=Path, help="the CSV to write")
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--gpus", type=int, default=640, help="the cluster the load is paced for")
    parser.add_argument("--load", type=float, default=1.3)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args(argv)
    rows = generate(args.jobs, args.gpus, args.load, seed=args.seed)
    write(args.out, rows)
    span = int(str(rows[-1]["submit_time"])) / 86_400 if rows else 0.0
    print(f"wrote {args.out}: {len(rows):,} jobs over {span:.1f} days")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
