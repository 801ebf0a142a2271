"""``gpuledger compare``: one workload under several policies, side by side.

Each policy runs in its own process (the runs are independent and CPU-bound), writes its
own ledger, and is summarised from that ledger by ``replay.metrics``. The result is a
table per tenant and overall, a JSON document and a self-contained HTML page of plots.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from events.filelog import LedgerDirReader, new_ledger
from replay.config import (
    ClusterFile,
    PolicyFile,
    QueuesFile,
    WorkloadFile,
    node_events,
    policy_event,
    queue_events,
)
from replay.conservation import ConservationMonitor
from replay.metrics import (
    HOUR_MS,
    collect,
    percentile,
    share_waits,
    tenant_rows,
    unallocated_gpu_hours,
    utilisation,
)
from replay.sim import InputRefusedError, SimJob, Simulation
from scheduler.core import State
from scheduler.core.apply import apply
from scheduler.core.fairshare import fair_shares
from scheduler.core.state import GANG_POLICIES
from scheduler.render.svg import bar_chart, esc, line_chart
from scheduler.render.table import Column, Unit, render_table


@dataclass(frozen=True, slots=True)
class Run:
    """One policy's run: where its ledger is and what it measured."""

    policy: str
    ledger: str
    seconds: float
    tenants: list[dict[str, Any]]
    utilisation: float
    unallocated_gpu_h: float
    utilisation_series: list[tuple[float, float]]
    depth_series: list[tuple[float, float]]
    jobs: dict[str, dict[str, Any]]
    summary: dict[str, Any]
    """The policy's headline figures (``summarise``)."""
    demand: dict[str, dict[str, float]]
    """Per leaf queue: what it deserves against what its work asks for
    (``offered_demand``; the same for every policy)."""
    cpu_seconds: float = 0.0
    """CPU time the simulation took (its process's: on a shared machine the wall time
    ``seconds`` also counts waiting for a core)."""
    shares: dict[str, dict[str, float | None]] = field(default_factory=dict)
    """Per queue: how much of its waiting its deserved quota explains
    (``replay.metrics.share_waits``)."""
    refused: list[InputRefusedError] = field(default_factory=list)
    """Inputs the scheduler refused and the run left out (only with ``skip_invalid``)."""


def _downsample(points: list[tuple[float, float]], limit: int = 400) -> list[tuple[float, float]]:
    if len(points) <= limit:
        return points
    step = len(points) / limit
    return [points[int(i * step)] for i in range(limit)] + [points[-1]]


def run_policy(
    cluster: ClusterFile,
    queues: QueuesFile,
    workload: WorkloadFile,
    policy: str,
    knobs: PolicyFile | None,
    ledger: str,
    skip_invalid: bool = False,
) -> Run:
    """Simulate one policy into ``ledger`` and summarise it (runs in a worker process)."""
    started = time.perf_counter()
    cpu_started = time.process_time()
    monitor = ConservationMonitor()
    with new_ledger(ledger) as writer:
        sim = Simulation(
            cluster,
            queues,
            workload,
            policy_event(policy, knobs),
            writer,
            skip_invalid=skip_invalid,
        )
        result = sim.run(observe=monitor.observe)
    seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu_started
    m = collect(LedgerDirReader(ledger).read(0))
    util = [(at / 1000, allocated / cap if cap else 0.0) for at, allocated, cap in m.utilisation]
    total: dict[str, int] = {}
    depth: list[tuple[float, float]] = []
    merged = sorted((at, q, n) for q, pts in m.depth.items() for at, n in pts)
    for at, queue, pending in merged:
        total[queue] = pending
        depth.append((at / 1000, float(sum(total.values()))))
    jobs = {
        j.job: {
            "queue": j.queue,
            "gpus": j.gpus / 1000,
            "ttr_s": None if j.time_to_ready_ms is None else j.time_to_ready_ms / 1000,
            "done_s": None if j.completion_ms is None else j.completion_ms / 1000,
            "preemptions": j.preemptions,
            "idle_gpu_h": j.idle_gpu_ms / HOUR_MS,
            "unschedulable": j.unschedulable,
        }
        for j in m.jobs.values()
    }
    deserved = deserved_gpus(cluster, queues)
    demand = offered_demand(sim.jobs, deserved)
    return Run(
        policy=policy,
        ledger=ledger,
        seconds=seconds,
        tenants=tenant_rows(m),
        utilisation=utilisation(m),
        unallocated_gpu_h=unallocated_gpu_hours(m),
        utilisation_series=_downsample(util),
        depth_series=_downsample(depth),
        jobs=jobs,
        summary=summarise(m, monitor, result.cycles),
        demand=demand,
        cpu_seconds=cpu_seconds,
        shares=share_waits(m, deserved),
        refused=result.refused,
    )


def summarise(m: Any, monitor: ConservationMonitor, cycles: int) -> dict[str, Any]:
    """A policy's headline figures: waits, lost work as a share of all GPU time allocated,
    preemptions, and idle time while a fitting job waited (``replay.conservation``)."""
    waits = [j.time_to_ready_ms / 1000 for j in m.jobs.values() if j.time_to_ready_ms is not None]
    allocated = sum(j.allocated_gpu_ms for j in m.jobs.values())
    lost = sum(j.lost_gpu_ms for j in m.jobs.values())
    return {
        "jobs": len(m.jobs),
        "ready": len(waits),
        "wait_avg_s": sum(waits) / len(waits) if waits else None,
        "wait_p50_s": percentile(waits, 0.5),
        "wait_p90_s": percentile(waits, 0.9),
        "lost_gpu_h": lost / HOUR_MS,
        "lost_share": lost / allocated if allocated else 0.0,
        "preemptions": sum(j.preemptions for j in m.jobs.values()),
        "idle_fit_min": monitor.waiting_minutes,
        "idle_fit_by_rule_min": monitor.held_by_rule_ms / 60_000,
        "idle_fit_gpu_h": monitor.idle_gpu_hours,
        "cycles": cycles,
    }


def offered_demand(jobs: Sequence[SimJob], deserved: dict[str, int]) -> dict[str, dict[str, float]]:
    """Per queue, the GPUs its work asks for if every job ran from its submission for its
    runtime — a property of the workload, the same under every policy — against its
    deserved quota: on average and at the peak over the workload's span (first submission
    to the last such end), and the share of that span it asked for more than it deserves.
    An average within the quota can hide bursts above it: while it asks for more, a queue
    borrows."""
    steps: dict[str, list[tuple[int, int]]] = {}
    for job in jobs:
        gpus = sum(p.gpu_milli for p in job.submitted.pods)
        steps.setdefault(job.submitted.queue, []).extend(
            [(job.at, gpus), (job.at + job.runtime_ms, -gpus)]
        )
    if not steps:
        return {}
    start = min(job.at for job in jobs)
    span = max(max(job.at + job.runtime_ms for job in jobs) - start, 1)
    result: dict[str, dict[str, float]] = {}
    for queue, changes in sorted(steps.items()):
        quota = deserved.get(queue, 0)
        changes.sort()
        asked = peak = work = above = 0
        last = start
        for at, delta in changes:
            work += asked * (at - last)
            above += (at - last) if asked > quota else 0
            asked += delta
            peak = max(peak, asked)
            last = at
        result[queue] = {
            "deserved_gpus": quota / 1000,
            "demand_gpus": work / 1000 / span,
            "peak_gpus": peak / 1000,
            "above_pct": 100 * above / span,
        }
    return result


def deserved_gpus(cluster: ClusterFile, queues: QueuesFile) -> dict[str, int]:
    """Each queue's deserved milli-GPUs on this cluster (the core's division)."""
    state = State()
    for event in [*node_events(cluster), *queue_events(queues)]:
        apply(state, event, 0)
    shares = fair_shares(state)
    return {name: shares.deserved[name][0] for name in state.queues}


def compare(
    cluster: ClusterFile,
    queues: QueuesFile,
    workload: WorkloadFile,
    policies: Sequence[str],
    out: Path,
    *,
    knobs: PolicyFile | None = None,
    workers: int = 2,
    skip_invalid: bool = False,
) -> list[Run]:
    """Run every policy (in parallel processes) into ``out/<policy>/ledger``."""
    out.mkdir(parents=True, exist_ok=True)
    args = [
        (cluster, queues, workload, p, knobs, str(out / p / "ledger"), skip_invalid)
        for p in policies
    ]
    if workers <= 1 or len(policies) == 1:
        return [run_policy(*a) for a in args]
    with ProcessPoolExecutor(max_workers=min(workers, len(policies))) as pool:
        futures = [pool.submit(run_policy, *a) for a in args]
        return [f.result() for f in futures]


# --------------------------------------------------------------------------- rendering

FIGURES: tuple[tuple[str, str, Unit], ...] = (
    ("p50 TTR", "ttr_p50_s", "duration"),
    ("p90 TTR", "ttr_p90_s", "duration"),
    ("p99 TTR", "ttr_p99_s", "duration"),
    ("p50 done", "done_p50_s", "duration"),
    ("p90 done", "done_p90_s", "duration"),
    ("p99 done", "done_p99_s", "duration"),
    ("preempt", "preemptions", "count"),
    ("lost GPU-h", "lost_gpu_h", "hours"),
    ("idle GPU-h", "idle_gpu_h", "hours"),
    ("done/day", "finished_per_day", "number"),
)


def table(runs: Sequence[Run]) -> str:
    """One row per (tenant, policy): every figure; then utilisation per policy."""
    columns = [
        Column("queue", unit="text"),
        Column("policy", unit="text"),
        Column("jobs", unit="count"),
        Column("ready", unit="count"),
        *(Column(key, name, unit) for name, key, unit in FIGURES),
    ]
    rows = [
        {**next(r for r in run.tenants if r["queue"] == queue), "policy": run.policy}
        for queue in [r["queue"] for r in runs[0].tenants]
        for run in runs
    ]
    text = [
        "Per tenant and policy: times to ready (TTR) and to done, from submission",
        render_table(rows, columns),
        "  done/day: jobs finished per day of the run; idle GPU-h: GPUs held but not running",
        "",
        "Per policy",
        summary_table(runs),
        "  lost %: work thrown away by preemption over all GPU time allocated; idle-fit min:",
        "  minutes with free GPUs while a job that fits them waited (by rule min: of those,",
        "  minutes its queue's limit or quota held every such job back)",
        "",
        "Per queue: its demand against its deserved quota",
        demand_table(runs),
        "  demand (if every job ran from its submission): within (never above its quota),",
        "  bursts (within on average, above at times) or borrows (above on average);",
        "  X/fifo: a policy's p90 wait over fifo's (below 1: shorter)",
        "",
        "Per queue and gang policy: how much of the waiting its deserved quota explains",
        share_table(runs),
        "  % wait at share: the part of the queue's waiting while starting the job would have",
        "  taken it above its deserved quota; p90 within share: p90 of each job's waiting",
        "  otherwise (what the quota does not explain); within/fifo p90: that over fifo's p90",
        "  wait (below 1: shorter)",
    ]
    return "\n".join(text)


SUMMARY: tuple[Column, ...] = (
    Column("policy", unit="text"),
    Column("wait_avg_s", "avg wait", "duration"),
    Column("wait_p50_s", "p50 wait", "duration"),
    Column("wait_p90_s", "p90 wait", "duration"),
    Column("util_pct", "GPU util %", "number"),
    Column("lost_gpu_h", "lost GPU-h", "hours"),
    Column("lost_pct", "lost %", "number"),
    Column("preemptions", "preempt", "count"),
    Column("idle_fit_min", "idle-fit min", "number"),
    Column("idle_fit_by_rule_min", "by rule min", "number"),
    Column("idle_fit_gpu_h", "idle-fit GPU-h", "hours"),
    Column("seconds", "sim s", "number"),
)
"""One row per policy. ``lost %``: GPU time thrown away by preemption over all GPU time
allocated. ``idle-fit min``: minutes with free GPUs outside reservations while
a pending job that fits them waited; ``by rule min``: of those, minutes where every such
job was held by its queue's limit or the non-preemptible quota rule."""


def summary_table(runs: Sequence[Run]) -> str:
    """The headline figures, one row per policy."""
    rows = [
        {
            **run.summary,
            "policy": run.policy,
            "util_pct": 100 * run.utilisation,
            "lost_pct": 100 * run.summary["lost_share"],
            "seconds": run.seconds,
        }
        for run in runs
    ]
    return render_table(rows, list(SUMMARY))


def demand_class(d: dict[str, float]) -> str:
    """``within``: the queue's work never asks for more than it deserves; ``bursts``: on
    average it does not, but at times it does (and borrows then); ``borrows``: on
    average it asks for more."""
    if d["above_pct"] <= 0:
        return "within"
    return "bursts" if d["demand_gpus"] <= d["deserved_gpus"] else "borrows"


def demand_table(runs: Sequence[Run]) -> str:
    """Per queue: what it deserves against what its work asks for (``offered_demand``:
    on average, at the peak, and the share of the time above its deserved quota), and its
    p90 wait under each policy with the ratio to fifo's (a queue asking more than it
    deserves borrows, and may wait longer by what its share explains: ``share_table``)."""
    first = runs[0]
    fifo = next((r for r in runs if r.policy == "fifo"), None)
    rows: list[dict[str, Any]] = []
    for queue, d in first.demand.items():
        row: dict[str, Any] = {
            "queue": queue,
            "deserved": d["deserved_gpus"],
            "demand": d["demand_gpus"],
            "peak": d["peak_gpus"],
            "above": d["above_pct"],
            "within": demand_class(d),
        }
        base = _p90(fifo, queue) if fifo is not None else None
        for run in runs:
            p90 = _p90(run, queue)
            row[run.policy] = p90
            if base is not None and p90 is not None and run is not fifo:
                row[f"{run.policy}/fifo"] = p90 / base if base > 0 else None
        rows.append(row)
    columns = [
        Column("queue", unit="text"),
        Column("deserved", "deserved GPUs", "number"),
        Column("demand", "avg demand GPUs", "number"),
        Column("peak", "peak demand", "number"),
        Column("above", "% time above", "number"),
        Column("within", "demand", "text"),
        *(Column(run.policy, f"p90 {run.policy}", "duration") for run in runs),
        *(
            Column(f"{run.policy}/fifo", f"{run.policy}/fifo", "number")
            for run in runs
            if fifo is not None and run is not fifo
        ),
    ]
    return render_table(rows, columns)


SHARES: tuple[Column, ...] = (
    Column("queue", unit="text"),
    Column("policy", unit="text"),
    Column("ttr_p90_s", "p90 wait", "duration"),
    Column("wait_at_share_pct", "% wait at share", "number"),
    Column("in_share_p90_s", "p90 within share", "duration"),
    Column("ratio", "within/fifo p90", "number"),
)
"""One row per queue and policy with quotas: of each job's wait, the part while its queue
held so much of its deserved quota that the job would have borrowed had it started
(``% wait at share``: what the queue's share explains), and the p90 of the rest (``p90
within share``), against fifo's p90 wait for the queue."""


def within_share_ratios(runs: Sequence[Run], policy: str = "gpuledger") -> dict[str, float | None]:
    """Per queue, the policy's p90 of the wait its deserved quota does not explain
    (``share_waits``) over fifo's p90 wait: the share table's last column (None where a
    run is missing)."""
    fifo = next((r for r in runs if r.policy == "fifo"), None)
    run = next((r for r in runs if r.policy == policy), None)
    if fifo is None or run is None:
        return {}
    ratios: dict[str, float | None] = {}
    for queue, row in run.shares.items():
        base = _p90(fifo, queue)
        within = row["in_share_p90_s"]
        ratios[queue] = within / base if base and within is not None else None
    return ratios


def share_table(runs: Sequence[Run]) -> str:
    """How much of each queue's waiting its deserved quota explains, per policy with
    quotas (``replay.metrics.share_waits``), against fifo's p90 wait."""
    ratios = {run.policy: within_share_ratios(runs, run.policy) for run in runs}
    rows: list[dict[str, Any]] = []
    for queue in runs[0].demand:
        for run in runs:
            row = run.shares.get(queue)
            if run.policy not in GANG_POLICIES or row is None:
                continue
            ratio = ratios[run.policy].get(queue)
            rows.append({"queue": queue, "policy": run.policy, **row, "ratio": ratio})
    return render_table(rows, list(SHARES))


def _p90(run: Run, queue: str) -> float | None:
    row = next((r for r in run.tenants if r["queue"] == queue), None)
    return None if row is None else row.get("ttr_p90_s")


def to_json(runs: Sequence[Run]) -> dict[str, Any]:
    """Everything measured, for machines."""
    return {
        run.policy: {
            "ledger": run.ledger,
            "seconds": run.seconds,
            "utilisation": run.utilisation,
            "unallocated_gpu_h": run.unallocated_gpu_h,
            "summary": run.summary,
            "demand": run.demand,
            "shares": run.shares,
            "tenants": run.tenants,
        }
        for run in runs
    }


def to_html(runs: Sequence[Run], title: str) -> str:
    """A self-contained page: percentile bars per tenant, utilisation and queue depth."""

    queues = [r["queue"] for r in runs[0].tenants]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{esc(title)}</title>",
        "<style>body{font-family:sans-serif;margin:2em;max-width:1100px}"
        "table{border-collapse:collapse}td,th{padding:2px 8px;border-bottom:1px solid #ddd;"
        "text-align:right}td:first-child,th:first-child{text-align:left}</style>",
        f"</head><body><h1>{esc(title)}</h1>",
    ]
    for label, key in (("p50", "ttr_p50_s"), ("p90", "ttr_p90_s"), ("p99", "ttr_p99_s")):
        series = {
            run.policy: [next(r for r in run.tenants if r["queue"] == q)[key] for q in queues]
            for run in runs
        }
        parts.append(
            bar_chart(f"{label} time to ready by tenant", queues, series, y_format="duration")
        )
    parts.append(
        line_chart(
            "GPU utilisation over time",
            {run.policy: run.utilisation_series for run in runs},
            y_label="allocated / capacity",
        )
    )
    parts.append(
        line_chart(
            "Queue depth over time",
            {run.policy: run.depth_series for run in runs},
            y_label="pending jobs",
        )
    )
    parts.append("<h2>Per tenant</h2><pre>")
    parts.append(esc(table(runs)))
    parts.append("</pre></body></html>")
    return "\n".join(parts)


def write(runs: Sequence[Run], out: Path, title: str) -> tuple[Path, Path]:
    """Write compare.json and compare.html under ``out``."""
    json_path = out / "compare.json"
    html_path = out / "compare.html"
    json_path.write_text(json.dumps(to_json(runs), indent=2) + "\n")
    html_path.write_text(to_html(runs, title))
    return json_path, html_path
