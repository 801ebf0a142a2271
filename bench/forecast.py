"""How good are the forecasts? Each job's forecast start against the start its ledger records.

    python -m bench.forecast [--every 10] [--limit 200] [--no-congested]
                             [--estimates given|learned|running-given|pending-given ...]
                             [--arrivals none|recent ...] [--samples N] [--jobs N]
                             [--json FILE]

On both of ``bench.policy``'s runs — the multi-tenant week (``bench/multitenant``) and,
where the shared trace is present, the congested Alibaba 2023 run — gpuledger simulates the
workload into a ledger. Then, at every ``--every``-th submission (thinned evenly to at most
``--limit`` per run; ``--limit 0``: all of them), the job's start is forecast from the
ledger as it stood when the job was submitted (``replay.forecast``), and compared with
the start the same ledger records:

- with **given** estimates: every job's true runtime, as a user who states it exactly would
  give it (the workload's runtimes);
- with **learned** estimates: only what the ledger's history says of jobs like it;
- as diagnostics, not measured by default (``--estimates``): **running-given** gives the
  true runtimes of only the jobs running at the moment, **pending-given** those of only
  the jobs pending, the rest learned: how much of the learned error each side's
  estimates make.

Only the sampled jobs that waited at least 10 minutes are forecast (the others are
counted). Printed per run and kind, for those: how many were
rightly forecast later than the 7-day horizon (they started later still: no start to
compare, so not in the errors); over the others, with the forecast start (the middle
run's), the median absolute error (minutes), the median error relative to the actual
wait (with its 95 % bootstrap interval over the jobs sampled: ``interval``), the share
of forecasts within ±25 % of it and the bias (median signed error:
positive is late); over all, the share of actual starts inside the forecast range
(between the earliest and the latest run's start). Then the cost of forecasting
every pending job of ``bench.core``'s ``cycle-1000`` state. Tests never assert on these
numbers.

Each run, estimates and arrivals is measured in its own process, ``--jobs`` at a time (the
machine's cores by default): every forecast is deterministic, so the figures are those of
one process doing all of them, and only the wall time shrinks. The cost is measured first,
alone.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.cluster import packed
from bench.measure import provenance
from bench.policy import congested_inputs
from events.codec import decode_event
from events.memlog import MemoryLedger
from events.model import JobSubmitted
from replay.config import ClusterFile, QueuesFile, WorkloadFile, load, policy_event
from replay.forecast import ARRIVALS, SAMPLES, Moment, Recent, forecast, moment_of
from replay.sim import Simulation
from scheduler.core.state import ACTIVE, PENDING, State
from scheduler.fold.outcomes import OutcomeFold

HERE = Path(__file__).parent / "multitenant"
WAITED_MS = 10 * 60_000
"""The targets hold for jobs that waited at least this long."""
ESTIMATES = ("given", "learned")
"""The estimates measured by default, each with its target."""
DIAGNOSTICS = ("running-given", "pending-given")
"""Estimates measured on request: true runtimes for one side of the moment only."""
TARGETS = {"given": 0.20, "learned": 0.50}
"""The median relative error each kind of estimates should stay within."""
KINDS = tuple(f"{estimates} / {assumed}" for estimates in ESTIMATES for assumed in ARRIVALS)
"""What is measured on each run: given or learned estimates, under each arrivals assumption."""


@dataclass(frozen=True, slots=True)
class Case:
    """One forecast against what happened."""

    job: str
    submitted_ms: int
    actual_ms: int
    median_ms: int
    earliest_ms: int
    latest_ms: int | None
    horizon_end_ms: int

    @property
    def beyond(self) -> bool:
        """Forecast later than the horizon, and it did start later: right, with no
        start to compare."""
        return self.median_ms >= self.horizon_end_ms and self.actual_ms > self.horizon_end_ms


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else float("nan")


RESAMPLES = 2000
"""Bootstrap resamples behind a median's interval (``interval``)."""


def interval(values: list[float], resamples: int = RESAMPLES) -> tuple[float, float]:
    """The 95 % bootstrap interval of ``values``' median: how far it could move had other
    jobs of the same runs been sampled. The resamples are drawn from a fixed seed, so a
    rerun prints the same interval."""
    if not values:
        return float("nan"), float("nan")
    draw = random.Random(0)
    medians = sorted(_median(draw.choices(values, k=len(values))) for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def figures(cases: list[Case]) -> dict[str, Any]:
    """The accuracy figures of the cases whose job waited at least ``WAITED_MS`` (the
    bench forecasts only those; ``forecasts`` it sets to the pending jobs it sampled): the
    errors of those with a start to compare (a forecast within the horizon, or an actual
    start within it), and how many were rightly forecast later than the horizon."""
    waited = [c for c in cases if c.actual_ms - c.submitted_ms >= WAITED_MS]
    compared = [c for c in waited if not c.beyond]
    errors = [(c.median_ms - c.actual_ms) for c in compared]
    relative = [
        abs(e) / (c.actual_ms - c.submitted_ms) for e, c in zip(errors, compared, strict=True)
    ]
    inside = [
        c.earliest_ms <= c.actual_ms and (c.latest_ms is None or c.actual_ms <= c.latest_ms)
        for c in waited
    ]
    return {
        "forecasts": len(cases),
        "waited_10min": len(waited),
        "beyond_horizon": len(waited) - len(compared),
        "median_abs_error_min": _median([abs(e) / 60_000 for e in errors]),
        "median_relative_error": _median(relative),
        "median_relative_error_95": interval(relative),
        "within_25pct": sum(r <= 0.25 for r in relative) / len(relative)
        if relative
        else float("nan"),
        "bias_min": _median([e / 60_000 for e in errors]),
        "range_holds": sum(inside) / len(inside) if inside else float("nan"),
    }


def given_for(estimates: str, runtimes: dict[str, int], state: State) -> dict[str, int] | None:
    """The runtimes a forecast is given for ``estimates`` (``ESTIMATES``, ``DIAGNOSTICS``)
    at the moment ``state`` holds: every job's, none (learned), or those of the jobs
    running (active) or pending then only."""
    if estimates == "given":
        return runtimes
    if estimates == "learned":
        return None
    side = ACTIVE if estimates == "running-given" else (PENDING,)
    return {j.job: runtimes[j.job] for j in state.jobs.values() if j.status in side}


def _simulate(
    cluster: ClusterFile, queues: QueuesFile, workload: WorkloadFile
) -> tuple[MemoryLedger, dict[str, int]]:
    ledger = MemoryLedger()
    sim = Simulation(cluster, queues, workload, policy_event("gpuledger", None), ledger)
    sim.run()
    return ledger, dict(sim.runtime)


def sampled(submissions: list[int], every: int, limit: int) -> list[int]:
    """Every ``every``-th of ``submissions`` (the first included), thinned evenly to at
    most ``limit`` (0: not thinned)."""
    out = submissions[::every]
    if 0 < limit < len(out):
        step = len(out) / limit
        out = [out[int(k * step)] for k in range(limit)]
    return out


def measure_run(
    name: str,
    cluster: ClusterFile,
    queues: QueuesFile,
    workload: WorkloadFile,
    every: int,
    limit: int,
    kinds: Sequence[str] = KINDS,
    samples: int = SAMPLES,
) -> dict[str, Any]:
    """Simulate, then forecast the sampled submissions for each of ``kinds`` (``KINDS``:
    given or learned estimates, under an arrivals assumption), each from ``samples`` runs:
    the figures by kind."""
    started = time.perf_counter()
    ledger, runtimes = _simulate(cluster, queues, workload)
    records = list(ledger.read(0))
    world = moment_of(records)
    placed: dict[str, int] = {}  # the start a ledger records: a job's first pods_allocated
    for _, env in records:
        if env.type == "pods_allocated":
            placed.setdefault(env.key, env.at)
    submissions = sampled(
        [i for i, (o, env) in enumerate(records) if env.type == "job_submitted"], every, limit
    )
    print(
        f"{name}: {len(records):,} records, {len(runtimes):,} jobs simulated in "
        f"{time.perf_counter() - started:.1f} s; forecasting {len(submissions)} submissions",
        file=sys.stderr,
    )
    fold = OutcomeFold()
    recent = Recent()
    cases: dict[str, list[Case]] = {kind: [] for kind in kinds}
    position = 0
    cost = 0.0
    pending = 0  # sampled jobs still pending at their submission: the ones forecast
    for count, index in enumerate(submissions, start=1):
        if count % 20 == 0:  # before the skips below, so that a skipped job reports too
            print(
                f"  {name} ({', '.join(kinds)}): {count}/{len(submissions)} sampled ({cost:.1f} s)",
                file=sys.stderr,
            )
        while position <= index:
            offset, env = records[position]
            event = decode_event(env, offset)
            fold.apply(event, offset, env.at)
            if isinstance(event, JobSubmitted):
                recent.note(env.at, event)
            position += 1
        event = decode_event(records[index][1], records[index][0])
        assert isinstance(event, JobSubmitted)
        actual = placed.get(event.job)
        job = fold.state.jobs.get(event.job)
        if actual is None or job is None or job.status != PENDING:
            continue  # never ran, refused, or placed at once
        pending += 1
        if actual - job.submitted_at < WAITED_MS:
            continue  # not in the figures: not forecast, for speed
        moment = Moment(fold, world.bind_ms, world.startup_ms, records[index][0], recent)
        for kind, bucket in cases.items():
            estimates, assumed = kind.split(" / ")
            given = given_for(estimates, runtimes, fold.state)
            t = time.perf_counter()
            (f,) = forecast(
                moment, given=given, jobs=[event.job], arrivals=assumed, samples=samples
            ) or (None,)
            cost += time.perf_counter() - t
            if f is None:  # started in the very cycle of its submission: not pending
                continue
            bucket.append(
                Case(
                    event.job,
                    job.submitted_at,
                    actual,
                    f.median_ms if f.median_ms is not None else f.horizon_end_ms,
                    f.earliest_ms if f.earliest_ms is not None else f.horizon_end_ms,
                    f.latest_ms,
                    f.horizon_end_ms,
                )
            )
    out: dict[str, Any] = {kind: {**figures(c), "forecasts": pending} for kind, c in cases.items()}
    out["seconds_per_forecast"] = cost / max(1, sum(len(c) for c in cases.values()))
    return out


Inputs = tuple[ClusterFile, QueuesFile, WorkloadFile]


def _multitenant() -> Inputs:
    return (
        load(HERE / "cluster.yaml", ClusterFile),
        load(HERE / "queues.yaml", QueuesFile),
        load(HERE / "workload.yaml", WorkloadFile),
    )


def _congested() -> Inputs | None:
    inputs = congested_inputs()
    return None if inputs is None else inputs[:3]


RUNS: dict[str, Callable[[], Inputs | None]] = {
    "multi-tenant": _multitenant,
    "congested": _congested,
}
"""The runs measured, and their inputs (None: not on this machine)."""


def measure_kind(
    run: str, kind: str, every: int, limit: int, samples: int = SAMPLES
) -> dict[str, Any] | None:
    """One run's figures for one kind (in a worker process: ``main``), with its forecasts'
    seconds each; None when the run's inputs are not here."""
    inputs = RUNS[run]()
    if inputs is None:
        return None
    out = measure_run(run, *inputs, every, limit, (kind,), samples)
    return {**out[kind], "seconds_per_forecast": out["seconds_per_forecast"]}


def measure(
    runs: Sequence[str],
    kinds: Sequence[str],
    every: int,
    limit: int,
    jobs: int,
    samples: int = SAMPLES,
) -> dict[str, dict[str, Any]]:
    """Every run's figures by kind, each (run, kind) in a fresh process, ``jobs`` at once;
    learned estimates under ``recent`` arrivals (the slowest) start first."""
    tasks = sorted(
        ((run, kind) for run in runs for kind in kinds),
        key=lambda t: (not t[1].startswith("learned"), not t[1].endswith("recent")),
    )
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=spawn) as pool:
        done = {t: pool.submit(measure_kind, *t, every, limit, samples) for t in tasks}
        figures_ = {t: future.result() for t, future in done.items()}
    results: dict[str, dict[str, Any]] = {}
    for run in runs:
        kinds_ = {k: figures_[(run, k)] for k in kinds if figures_[(run, k)] is not None}
        if kinds_:
            results[run] = kinds_
        else:
            print(f"({run}: its inputs are not on this machine: skipped)")
    return results


def cycle_cost(nodes: int = 1000, pods: int = 20_000, pending: int = 5_000) -> dict[str, Any]:
    """Forecast every pending job of ``bench.core``'s ``cycle-1000`` state (built
    directly: no ledger, so no history; every running and pending job is given a runtime
    of 1 to 8 hours, by its name's hash-free position)."""
    state = packed(nodes, pods, pending, "gpuledger")
    state.running_index()
    given = {
        name: (1 + i % 8) * 3_600_000 for i, name in enumerate(j.job for j in state.jobs.values())
    }
    moment = Moment(OutcomeFold(state=state), 500, 5000, -1)
    started = time.perf_counter()
    cpu = time.process_time()
    result = forecast(moment, given=given)
    return {
        "pending": len(result),
        "started_within_horizon": sum(f.earliest_ms is not None for f in result),
        "seconds": time.perf_counter() - started,
        "cpu_seconds": time.process_time() - cpu,
    }


def relative_error(f: dict[str, Any]) -> str:
    """The median relative error with its 95 % interval, as the tables print it."""
    bounds = f.get("median_relative_error_95")  # absent from figures measured before it
    within = f" ({100 * bounds[0]:.0f}–{100 * bounds[1]:.0f})" if bounds else ""
    return f"{100 * f['median_relative_error']:.0f} %{within}"


def meets_target(estimates: str, f: dict[str, Any]) -> bool | None:
    """Whether figures ``f`` of ``estimates`` keep within its target (``TARGETS``); None for
    a diagnostic, which has none."""
    target = TARGETS.get(estimates)
    return None if target is None else f["median_relative_error"] <= target


def _row(label: str, f: dict[str, Any]) -> str:
    return (
        f"{label:<38} {f['forecasts']:>9} {f['waited_10min']:>6} {f['beyond_horizon']:>7}"
        f" {f['median_abs_error_min']:>12.1f}"
        f" {relative_error(f):>16} {100 * f['within_25pct']:>8.0f} %"
        f" {f['bias_min']:>10.1f} {100 * f['range_holds']:>10.0f} %"
    )


def report(results: dict[str, dict[str, Any]]) -> str:
    """The figures as a table with targets."""
    lines = [
        "Forecast accuracy (jobs that waited >= 10 min; error = forecast start (the middle "
        "run's) - actual start)",
        f"{'run / estimates / arrivals':<38} {'forecasts':>9} {'waited':>6} {'beyond':>7}"
        f" {'median |err|':>12} {'median rel.':>16} {'in ±25%':>10} {'bias':>10} {'in range':>12}",
        f"{'':<38} {'':>9} {'':>6} {'':>7} {'(min)':>12} {'(95 % interval)':>16} {'':>10}"
        f" {'(min)':>10} {'':>12}",
    ]
    for run, figures_ in results.items():
        for kind, f in figures_.items():
            if not isinstance(f, dict):
                continue
            estimates = kind.split(" / ")[0]
            meets = meets_target(estimates, f)
            if meets is None:
                lines.append(_row(f"{run} / {kind}", f) + "   (diagnostic)")
                continue
            mark = "ok" if meets else "MISSED"
            target = TARGETS[estimates]
            lines.append(_row(f"{run} / {kind}", f) + f"   (<= {100 * target:.0f} %: {mark})")
    lines.append(
        "beyond: forecast later than the horizon and started later (right; not in the errors)."
        "\nin range: the share of actual starts between the earliest and the latest run's "
        "start (target >= 70 % with learned estimates)"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the accuracy measurement on both runs and print the table."""
    parser = argparse.ArgumentParser(prog="python -m bench.forecast")
    parser.add_argument("--every", type=int, default=10, help="forecast every N-th submission")
    parser.add_argument(
        "--limit",
        type=int,
        default=200,
        help="at most this many per run, thinned evenly (default 200; 0: every --every-th "
        "submission)",
    )
    parser.add_argument("--no-congested", action="store_true", help="skip the Alibaba run")
    parser.add_argument(
        "--estimates",
        action="append",
        choices=ESTIMATES + DIAGNOSTICS,
        help="measure with these estimates only (repeatable; default: given and learned; "
        "running-given and pending-given are diagnostics)",
    )
    parser.add_argument(
        "--arrivals",
        action="append",
        choices=ARRIVALS,
        help="measure under this arrivals assumption only (repeatable; default: each)",
    )
    parser.add_argument(
        "--samples",
        type=int,
        default=SAMPLES,
        help=f"runs per forecast where runtimes are learned (default {SAMPLES}, as "
        "gpuledger forecast's)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="measure this many runs and kinds at once, each in its own process (default: "
        "the machine's cores)",
    )
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    # The cost first, alone, in a fresh process as a user's forecast runs, not on a heap
    # the accuracy runs have grown.
    if args.samples < 1:
        parser.error(f"--samples {args.samples}: expected at least 1")
    cost = cycle_cost()
    estimates = tuple(args.estimates or ESTIMATES)
    arrivals = tuple(args.arrivals or ARRIVALS)
    kinds = [f"{e} / {a}" for e in ESTIMATES + DIAGNOSTICS if e in estimates for a in arrivals]
    runs = [r for r in RUNS if not (args.no_congested and r == "congested")]
    results: dict[str, Any] = measure(runs, kinds, args.every, args.limit, args.jobs, args.samples)
    print(report(results))
    print(f"runs per forecast with learned runtimes: {args.samples}")
    print(
        f"cost: forecasting all {cost['pending']:,} pending jobs of bench.core's cycle-1000 "
        f"state ({cost['started_within_horizon']:,} start within 7 days) took "
        f"{cost['seconds']:.1f} s ({cost['cpu_seconds']:.1f} CPU-s; target <= 10 s)"
    )
    results["cost"] = cost
    results["samples"] = args.samples
    results["sampling"] = {"every": args.every, "limit": args.limit}
    results["provenance"] = provenance()
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
