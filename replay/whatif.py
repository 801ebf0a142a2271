"""What-if: re-run a recorded history under another policy or queue configuration.

A ledger mixes facts that came from outside (nodes, queues, submissions, cancellations)
with consequences of the scheduler's decisions (binds, starts, ends). Replaying the
facts through another policy is not enough: the consequences would be wrong. So a what-if
keeps the outside facts, learns from the ledger how long each job really ran (the work
of its completed attempt plus what earlier attempts had checkpointed) and how long binds
and starts took, and simulates the rest under the new policy with the same world rules.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec

from events.codec import DecodeError, Envelope, decode_event
from events.filelog import LedgerDirReader, new_ledger
from events.model import (
    Event,
    JobCancelled,
    JobPreempted,
    JobSubmitted,
    NodeCordoned,
    NodeRegistered,
    NodeRemoved,
    PodBound,
    PodFinished,
    PodsAllocated,
    PodStarted,
    PolicyConfigured,
    QueueConfigured,
    QueueRemoved,
)
from events.port import LedgerReader
from replay.compare import FIGURES
from replay.config import PolicyFile, policy_event
from replay.metrics import LedgerMetrics, collect, percentile, tenant_rows
from replay.sim import InputRefusedError, SimJob, Simulation
from scheduler.core.policy import KAI_KNOBS, kai_knobs
from scheduler.render.table import Column, format_value, render_table


@dataclass(slots=True)
class History:
    """The outside facts of a ledger and what it teaches about runtimes and latencies."""

    world: list[tuple[int, Event]] = field(default_factory=list)
    jobs: list[SimJob] = field(default_factory=list)
    policy: PolicyConfigured | None = None
    bind_ms: int = 500
    startup_ms: int = 2000
    unfinished: int = 0
    """Jobs that had not ended when the ledger stops: they run for what they had done."""


def _window(at: int, start_ms: int | None, end_ms: int | None) -> bool:
    return (start_ms is None or at >= start_ms) and (end_ms is None or at < end_ms)


def extract(
    records: Iterable[tuple[int, Envelope]],
    *,
    start_ms: int | None = None,
    end_ms: int | None = None,
) -> History:
    """Collect a ledger's outside facts; jobs are those submitted in [start_ms, end_ms).

    Node and queue events before the window are kept (they describe the cluster the
    window ran on); times are shifted so the window starts at 0.
    """
    history = History()
    submitted: dict[str, tuple[int, JobSubmitted]] = {}
    kept: dict[str, int] = {}
    run_start: dict[str, int] = {}
    ran: dict[str, int] = {}
    last_at = 0
    alloc_at: dict[str, int] = {}
    bind_gaps: list[int] = []
    start_gaps: list[int] = []
    bound_at: dict[str, int] = {}
    for offset, env in records:
        last_at = max(last_at, env.at)
        try:
            event = decode_event(env, offset)
        except DecodeError:
            continue
        at = env.at
        match event:
            case PolicyConfigured():
                if history.policy is None:
                    history.policy = event
            case (
                NodeRegistered()
                | NodeRemoved()
                | NodeCordoned()
                | QueueConfigured()
                | QueueRemoved()
            ):
                if end_ms is None or at < end_ms:
                    history.world.append((at, event))
            case JobSubmitted():
                if _window(at, start_ms, end_ms) and event.job not in submitted:
                    submitted[event.job] = (at, event)
            case JobCancelled(job=job_id):
                if job_id in submitted:
                    history.world.append((at, event))
            case PodsAllocated(job=job_id):
                alloc_at[job_id] = at
            case PodBound(job=job_id):
                if job_id in alloc_at:
                    bind_gaps.append(at - alloc_at[job_id])
                bound_at[job_id] = at
            case PodStarted(job=job_id):
                if job_id not in run_start:
                    run_start[job_id] = at
                    if job_id in bound_at:
                        start_gaps.append(at - bound_at[job_id])
            case JobPreempted(job=job_id, checkpointed_ms=keep):
                kept[job_id] = kept.get(job_id, 0) + keep
                run_start.pop(job_id, None)
            case PodFinished(job=job_id):
                if job_id in run_start:
                    ran[job_id] = at - run_start[job_id]
            case _:
                pass
    origin = start_ms if start_ms is not None else 0
    for job_id, (at, event) in submitted.items():
        if job_id in ran:
            runtime = ran[job_id] + kept.get(job_id, 0)
        elif event.expected_runtime_ms is not None:
            runtime = event.expected_runtime_ms
            history.unfinished += 1
        else:
            began = run_start.get(job_id)
            runtime = (last_at - began if began is not None else 0) + kept.get(job_id, 0)
            history.unfinished += 1
        history.jobs.append(SimJob(at=at - origin, submitted=event, runtime_ms=max(1, runtime)))
    history.world = [(max(0, at - origin), e) for at, e in history.world]
    history.jobs.sort(key=lambda j: (j.at, j.submitted.job))
    if bind_gaps:
        history.bind_ms = int(percentile([float(g) for g in bind_gaps], 0.5) or 0)
    if start_gaps:
        history.startup_ms = int(percentile([float(g) for g in start_gaps], 0.5) or 0)
    return history


def replace_queues(history: History, queues: list[QueueConfigured]) -> None:
    """Swap the history's queue configuration for another (e.g. a 50/40/10 split)."""
    history.world = [(at, e) for at, e in history.world if not isinstance(e, QueueConfigured)]
    history.world[:0] = [(0, q) for q in queues]


@dataclass(slots=True)
class WhatIf:
    """A what-if's outcome: the history it re-ran, the policy recorded and the one run, and
    the comparison (``compare_rows``, ``changed_fates``)."""

    history: History
    recorded: PolicyConfigured
    policy: PolicyConfigured
    rows: list[dict[str, object]]
    fates: list[dict[str, object]]
    refused: list[InputRefusedError] = field(default_factory=list)
    """Recorded inputs the re-run refused (only with ``skip_invalid``)."""


def renamed(recorded: PolicyConfigured, name: str) -> PolicyConfigured:
    """The recorded policy under another name, as a what-if: ``kai`` puts KAI-Scheduler's
    knobs in force; leaving ``kai`` puts that policy's own defaults back for them."""
    if name == "kai":
        return kai_knobs(recorded)
    policy = msgspec.structs.replace(recorded, policy=name)
    if recorded.policy == "kai":
        own = policy_event(name)
        policy = msgspec.structs.replace(policy, **{k: getattr(own, k) for k in KAI_KNOBS})
    return policy


def what_if(
    reader: LedgerReader,
    ledger: str | os.PathLike[str],
    *,
    start_ms: int | None = None,
    end_ms: int | None = None,
    knobs: PolicyFile | None = None,
    policy_name: str | None = None,
    queues: list[QueueConfigured] | None = None,
    skip_invalid: bool = False,
) -> WhatIf:
    """Re-run the outside facts of ``reader``'s ledger between ``start_ms`` and ``end_ms``
    into the new ledger directory ``ledger`` and compare each tenant before and after.

    The policy is the recorded one with ``policy_name`` and ``knobs`` put in its place when
    given; ``queues`` replace the recorded queue configuration. A recorded input the
    new configuration refuses (a job whose queue is gone) raises ``InputRefusedError``; with
    ``skip_invalid`` it is left out and listed in ``refused``."""
    history = extract(reader.read(0), start_ms=start_ms, end_ms=end_ms)
    recorded = history.policy or policy_event("gpuledger")
    if knobs is not None:
        policy = policy_event(policy_name or recorded.policy, knobs)
    elif policy_name:
        policy = renamed(recorded, policy_name)
    else:
        policy = recorded
    if queues is not None:
        replace_queues(history, queues)
    with new_ledger(ledger) as writer:
        sim = Simulation.from_inputs(
            history.world,
            history.jobs,
            bind_ms=history.bind_ms,
            startup_ms=history.startup_ms,
            policy=policy,
            writer=writer,
            skip_invalid=skip_invalid,
        )
        result = sim.run()
    before = collect(reader.read(0), since_ms=start_ms)
    after = collect(LedgerDirReader(ledger).read(0))
    return WhatIf(
        history,
        recorded,
        policy,
        compare_rows(before, after),
        changed_fates(before, after),
        result.refused,
    )


# --------------------------------------------------------------------------- the report


def compare_rows(before: LedgerMetrics, after: LedgerMetrics) -> list[dict[str, object]]:
    """Per tenant and overall: each figure before and after, in one row."""
    a = {r["queue"]: r for r in tenant_rows(before)}
    b = {r["queue"]: r for r in tenant_rows(after)}
    rows: list[dict[str, object]] = []
    for queue in [q for q in a if q != "all"] + ["all"]:
        ra, rb = a.get(queue, {}), b.get(queue, {})
        row: dict[str, object] = {"queue": queue, "jobs": ra.get("jobs", 0)}
        for key in (
            "ttr_p50_s",
            "ttr_p90_s",
            "ttr_p99_s",
            "done_p50_s",
            "done_p90_s",
            "done_p99_s",
            "preemptions",
            "lost_gpu_h",
            "idle_gpu_h",
        ):
            row[f"{key}:before"] = ra.get(key)
            row[f"{key}:after"] = rb.get(key)
        rows.append(row)
    return rows


def changed_fates(
    before: LedgerMetrics, after: LedgerMetrics, top: int = 10
) -> list[dict[str, object]]:
    """The jobs whose time to ready changed most (never-ready counts as the longest)."""
    span = max(before.end, after.end) - min(before.start, after.start)
    out: list[tuple[int, str, dict[str, object]]] = []
    for job_id, old in before.jobs.items():
        new = after.jobs.get(job_id)
        if new is None:
            continue
        t0 = old.time_to_ready_ms
        t1 = new.time_to_ready_ms
        d0 = t0 if t0 is not None else span
        d1 = t1 if t1 is not None else span
        if d0 == d1 and old.preemptions == new.preemptions:
            continue
        out.append(
            (
                -abs(d1 - d0),
                job_id,
                {
                    "job": job_id,
                    "queue": old.queue,
                    "gpus": old.gpus / 1000,
                    "ttr_before_s": None if t0 is None else t0 / 1000,
                    "ttr_after_s": None if t1 is None else t1 / 1000,
                    "preemptions_before": old.preemptions,
                    "preemptions_after": new.preemptions,
                },
            )
        )
    out.sort(key=lambda item: (item[0], item[1]))
    return [row for _, _, row in out[:top]]


def report_of(result: WhatIf, queues_from: str | None = None) -> dict[str, object]:
    """What ``whatif.json`` holds: the changes made (``queues_from`` names where the new
    queues came from), the per-tenant rows and the jobs whose fate changed most. Written by
    ``gpuledger replay --out`` and by the console's What-if page alike."""
    changes = []
    if result.policy != result.recorded:
        changes.append(f"policy {result.recorded.policy} -> {result.policy.policy}")
    if queues_from is not None:
        changes.append(f"queues from {queues_from}")
    return {"changes": changes, "tenants": result.rows, "changed_fates": result.fates}


def whatif_table(rows: list[dict[str, object]]) -> str:
    """queue | jobs | for each figure: before -> after (``whatif.txt``)."""
    figures = [f for f in FIGURES if f[1] != "finished_per_day"]
    cells = [
        {
            "queue": row["queue"],
            "jobs": row["jobs"],
            **{
                key: f"{format_value(row[key + ':before'], unit)} -> "
                f"{format_value(row[key + ':after'], unit)}"
                for _, key, unit in figures
            },
        }
        for row in rows
    ]
    columns = [
        Column("queue", unit="text"),
        Column("jobs", unit="count"),
        *(Column(key, name, "text") for name, key, _ in figures),
    ]
    return render_table(cells, columns)
