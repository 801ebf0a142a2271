"""Soak: the demo workload at ten times its arrival rate, bounded in simulated time.

    python -m bench.soak [--factor 10] [--hours 12]
    python -m bench.soak --kafka [--minutes 3.5] [--rate 100] [--window 15]

With ``--kafka`` it soaks the live path instead: the real scheduler service on the real
broker, in wall-clock time (``bench/kafka_soak.py``).

Every generator's arrivals are multiplied by ``factor`` for the first half of the run (the
burst), then return to normal. Per simulated hour it prints the events, cycle latency
p50/p99 and the process's RSS, so one can see memory stay flat and latency recover after
the burst. Nothing here asserts: it prints figures.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from collections.abc import Sequence

import msgspec

from bench.measure import nearest_rank
from events.kafka_admin import DEFAULT_BOOTSTRAP
from events.memlog import MemoryLedger
from replay.config import ClusterFile, Periodic, Poisson, QueuesFile, WorkloadFile, load
from replay.examples import EXAMPLES
from replay.sim import Simulation
from scheduler.core import State

HOUR_MS = 3_600_000


def _faster(
    workload: WorkloadFile, factor: float, burst_s: float, horizon_s: float
) -> WorkloadFile:
    """Generators run ``factor`` times faster until ``burst_s``, then at their own pace."""
    gens = []
    for gen in workload.generators:
        burst: Poisson | Periodic
        match gen.arrival:
            case Poisson(rate_per_h=rate):
                burst = msgspec.structs.replace(gen.arrival, rate_per_h=rate * factor)
            case Periodic(every_s=every):
                burst = msgspec.structs.replace(gen.arrival, every_s=every / factor)
        gens.append(
            msgspec.structs.replace(gen, name=f"{gen.name}-burst", arrival=burst, end_s=burst_s)
        )
        gens.append(msgspec.structs.replace(gen, start_s=burst_s))
    return msgspec.structs.replace(workload, generators=gens, horizon_s=horizon_s, jobs=[])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak")
    parser.add_argument("--factor", type=float, default=10.0)
    parser.add_argument("--hours", type=float, default=12.0)
    kafka = parser.add_argument_group("live path (--kafka)")
    kafka.add_argument("--kafka", action="store_true", help="soak the scheduler service on Kafka")
    kafka.add_argument("--minutes", type=float, default=3.5, help="wall-clock length")
    kafka.add_argument("--rate", type=float, default=100.0, help="normal job submissions/s")
    kafka.add_argument("--window", type=float, default=15.0, help="seconds per table row")
    kafka.add_argument("--max-batch", type=int, help="the scheduler's --max-batch (its default)")
    kafka.add_argument("--snapshot-every", type=int, help="the scheduler's --snapshot-every")
    kafka.add_argument("--bootstrap", default=DEFAULT_BOOTSTRAP, help="Kafka bootstrap servers")
    kafka.add_argument("--json", default="out/soak-kafka.json", help="where to write the figures")
    args = parser.parse_args(argv)
    if args.kafka:
        from bench.kafka_soak import main as kafka_soak  # noqa: PLC0415  # needs the broker

        return kafka_soak(args)
    example = EXAMPLES["demo"]
    horizon = args.hours * 3600
    workload = _faster(
        load(example.path("workload"), WorkloadFile), args.factor, horizon / 2, horizon
    )
    sim = Simulation(
        load(example.path("cluster"), ClusterFile),
        load(example.path("queues"), QueuesFile),
        workload,
        "gpuledger",
        MemoryLedger(),
    )
    rows: dict[int, list[float]] = {}
    rss: dict[int, float] = {}
    engine_step = sim.engine.step

    def timed(inputs, now):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        out = engine_step(inputs, now)
        rows.setdefault(now // HOUR_MS, []).append(time.perf_counter() - started)
        rss[now // HOUR_MS] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return out

    sim.engine.step = timed  # type: ignore[method-assign]
    started = time.perf_counter()
    result = sim.run()
    elapsed = time.perf_counter() - started
    print(f"soak: {result.jobs} jobs ({args.factor:g}x arrivals for {args.hours / 2:g} h), "
          f"{result.records} ledger records in {elapsed:.1f} s")  # fmt: skip
    print(f"{'hour':>4}  {'cycles':>7}  {'p50 ms':>7}  {'p99 ms':>7}  {'max RSS MiB':>11}  phase")
    for hour in sorted(rows):
        times = sorted(rows[hour])
        p99 = nearest_rank(times, 0.99)
        phase = "burst" if hour < args.hours / 2 else "normal"
        print(f"{hour:>4}  {len(times):>7}  {1000 * statistics.median(times):>7.2f}  "
              f"{1000 * p99:>7.2f}  {rss[hour]:>11.0f}  {phase}")  # fmt: skip
    state: State = sim.engine.state
    print(f"jobs still pending at the end: {len(state.pending)}; the core holds "
          f"{len(state.jobs)} jobs whole and {len(state.ended)} ended ones as ids")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
