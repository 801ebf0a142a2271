"""What a ledger says about each job and tenant, computed straight from its events.

The what-if report and ``gpuledger compare`` need the same figures for two or more
ledgers side by side, quickly and without a database: per job its submission, first
readiness, end, preemptions, lost and idle GPU time; per queue the percentiles; over time
the GPU utilisation and the queue depth. The per-job figures come from
``scheduler.fold.outcomes.OutcomeFold``, the fold the DuckDB projector uses too, so both answer
the same questions with the same numbers.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from events.codec import DecodeError, Envelope, decode_event
from events.model import MILLI
from events.port import LedgerReader
from scheduler.fold.outcomes import JobOutcome, OutcomeFold, completion_ms

HOUR_MS = 3_600_000


@dataclass(slots=True)
class JobRecord:
    """One job's fate (``scheduler.fold.outcomes.JobOutcome`` in the units reports use)."""

    job: str
    queue: str
    gpus: int
    """Milli-GPUs the job asks for, over all its pods."""
    submitted: int
    ready: int | None = None
    allocated: int | None = None
    """When its pods were first allocated (before binding and starting: ``ready``)."""
    finished: int | None = None
    succeeded: bool = False
    preemptions: int = 0
    lost_gpu_ms: int = 0
    idle_gpu_ms: int = 0
    """GPU time allocated to the job while its gang was not running (half-placed, starting)."""
    allocated_gpu_ms: int = 0
    """GPU time allocated to the job, from each allocation until it was given back."""
    unschedulable: str = ""
    status: str = "pending"

    @property
    def time_to_ready_ms(self) -> int | None:
        """Submission until the gang first ran."""
        return None if self.ready is None else self.ready - self.submitted

    @property
    def completion_ms(self) -> int | None:
        """Submission until the end, for a job that ran and ended succeeded or failed."""
        return completion_ms(self.status, self.submitted, self.ready, self.finished)

    @classmethod
    def of(cls, outcome: JobOutcome) -> JobRecord:
        """The record of a fold's job outcome."""
        return cls(
            job=outcome.job,
            queue=outcome.queue,
            gpus=outcome.gpu_milli,
            submitted=outcome.submitted_at_ms,
            ready=outcome.ready_at_ms,
            finished=outcome.finished_at_ms,
            succeeded=outcome.status == "succeeded",
            preemptions=outcome.preemptions,
            lost_gpu_ms=outcome.lost_gpu_ms,
            idle_gpu_ms=outcome.idle_gpu_ms,
            allocated_gpu_ms=outcome.allocated_gpu_ms,
            unschedulable=outcome.unschedulable_reason or ""
            if outcome.status == "unschedulable"
            else "",
            status=outcome.status,
        )


@dataclass(slots=True)
class LedgerMetrics:
    """Every job of a ledger, plus timelines of capacity, allocation and queue depth."""

    jobs: dict[str, JobRecord] = field(default_factory=dict)
    capacity_gpu: int = 0
    start: int = 0
    end: int = 0
    utilisation: list[tuple[int, int, int]] = field(default_factory=list)
    """(at, allocated GPU milli, capacity GPU milli) at each change."""
    depth: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    """Per queue: (at, pending jobs) at each change."""
    held: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    """Per queue: (at, allocated milli-GPUs) at each change."""

    def queues(self) -> list[str]:
        """Queue names, sorted."""
        return sorted({j.queue for j in self.jobs.values()})


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (as numpy's default and DuckDB's quantile_cont)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def collect(
    records: Iterable[tuple[int, Envelope]], *, since_ms: int | None = None
) -> LedgerMetrics:
    """Fold a ledger's records into per-job metrics and timelines.

    Every record is folded (the core needs the nodes, queues and jobs from the start);
    with ``since_ms`` only jobs submitted at or after it are reported, and the span and
    timelines start there.
    """
    m = LedgerMetrics()
    fold = OutcomeFold(timelines=True)
    first = True
    for offset, env in records:
        at = env.at
        recording = since_ms is None or at >= since_ms
        if recording:
            if first:
                m.start = at
                first = False
                if since_ms is not None:
                    fold.utilisation.append((at, fold.allocated_milli, fold.capacity_milli))
            m.end = max(m.end, at)
        try:
            event = decode_event(env, offset)
        except DecodeError:
            continue
        fold.apply(event, offset, at, record=recording)
    m.jobs = {name: JobRecord.of(outcome) for name, outcome in fold.jobs.items()}
    for name, record in m.jobs.items():
        firsts = [p.first_allocated_at_ms for p in fold.pods.get(name, {}).values()]
        record.allocated = min((f for f in firsts if f is not None), default=None)
    m.capacity_gpu = fold.capacity_milli
    m.utilisation = fold.utilisation
    m.depth = fold.depth
    m.held = fold.held
    return m


def read_metrics(reader: LedgerReader, start: int = 0, end: int | None = None) -> LedgerMetrics:
    """``collect`` over a ledger reader."""
    return collect(reader.read(start, end))


# --------------------------------------------------------------------------- summaries


def tenant_rows(m: LedgerMetrics) -> list[dict[str, object]]:
    """Per queue and overall: percentiles in seconds, preemptions, lost and idle GPU-hours."""
    rows: list[dict[str, object]] = []
    span_days = max(m.end - m.start, 1) / (24 * HOUR_MS)
    for queue in [*m.queues(), "all"]:
        jobs = [j for j in m.jobs.values() if queue in ("all", j.queue)]
        ttr = [j.time_to_ready_ms / 1000 for j in jobs if j.time_to_ready_ms is not None]
        done = [j.completion_ms / 1000 for j in jobs if j.completion_ms is not None]
        finished = sum(1 for j in jobs if j.finished is not None and j.ready is not None)
        rows.append(
            {
                "queue": queue,
                "jobs": len(jobs),
                "ready": len(ttr),
                "ttr_p50_s": percentile(ttr, 0.5),
                "ttr_p90_s": percentile(ttr, 0.9),
                "ttr_p99_s": percentile(ttr, 0.99),
                "done_p50_s": percentile(done, 0.5),
                "done_p90_s": percentile(done, 0.9),
                "done_p99_s": percentile(done, 0.99),
                "preemptions": sum(j.preemptions for j in jobs),
                "lost_gpu_h": sum(j.lost_gpu_ms for j in jobs) / HOUR_MS,
                "idle_gpu_h": sum(j.idle_gpu_ms for j in jobs) / HOUR_MS,
                "finished_per_day": finished / span_days,
            }
        )
    return rows


def share_waits(m: LedgerMetrics, deserved: dict[str, int]) -> dict[str, dict[str, float | None]]:
    """Per queue, how much of its jobs' waiting (submission to first start) its deserved
    GPU quota explains: a job waits *at its share* while its queue holds so much that the
    job would take it above its deserved quota (``deserved`` milli-GPUs) if it started —
    starting it then would be borrowing — and *within its share* while it would not (and
    from its first allocation until it runs: binding and starting, not its share).

    ``wait_at_share_pct``: the part of all the queue's waiting that was at its share;
    ``in_share_p90_s``: the p90 over its jobs of the waiting each did within its share
    (the wait that the queue's share does not explain); ``ttr_p90_s``: the p90 of the
    whole waits, for reference."""
    rows: dict[str, dict[str, float | None]] = {}
    for queue in m.queues():
        jobs = [j for j in m.jobs.values() if j.queue == queue and j.ready is not None]
        quota = deserved.get(queue, 0)
        series = m.held.get(queue, [])
        clocks = {g: _AtShare(series, quota - g, m.start) for g in {j.gpus for j in jobs}}
        total = at_share = 0
        waits: list[float] = []
        within: list[float] = []
        for j in jobs:
            assert j.ready is not None
            clock = clocks[j.gpus]
            until = j.ready if j.allocated is None else min(j.allocated, j.ready)
            part = clock.until(until) - clock.until(j.submitted)
            total += j.ready - j.submitted
            at_share += part
            waits.append((j.ready - j.submitted) / 1000)
            within.append((j.ready - j.submitted - part) / 1000)
        rows[queue] = {
            "ttr_p90_s": percentile(waits, 0.9),
            "wait_at_share_pct": 100 * at_share / total if total else None,
            "in_share_p90_s": percentile(within, 0.9),
        }
    return rows


class _AtShare:
    """Time a queue spent holding more than ``threshold`` milli-GPUs, from ``start`` until
    a given time, over its step series of (at, held)."""

    def __init__(self, series: list[tuple[int, int]], threshold: int, start: int) -> None:
        self.at = [start]
        self.over = [threshold < 0]
        self.total = [0]
        for at, held in series:
            if at < self.at[-1]:
                continue
            self.total.append(self.total[-1] + (at - self.at[-1]) * self.over[-1])
            self.at.append(at)
            self.over.append(held > threshold)

    def until(self, when: int) -> int:
        """The time spent above the threshold from the start until ``when``."""
        i = bisect_right(self.at, when) - 1
        if i < 0:
            return 0
        return self.total[i] + (when - self.at[i]) * self.over[i]


def utilisation(m: LedgerMetrics) -> float:
    """Allocated GPU time over capacity GPU time across the ledger's span."""
    used = 0
    capacity = 0
    for (at, allocated, cap), (nxt, _, _) in zip(m.utilisation, m.utilisation[1:], strict=False):
        used += allocated * (nxt - at)
        capacity += cap * (nxt - at)
    return used / capacity if capacity else 0.0


def unallocated_gpu_hours(m: LedgerMetrics) -> float:
    """GPU-hours of capacity that no job held, across the ledger's span."""
    free = 0
    for (at, allocated, cap), (nxt, _, _) in zip(m.utilisation, m.utilisation[1:], strict=False):
        free += (cap - allocated) * (nxt - at)
    return free / MILLI / HOUR_MS
