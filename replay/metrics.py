"""What a ledger says about each job and tenant, computed straight from its events.

The what-if report and ``gpuledger compare`` need the same figures for two or more
ledgers side by side, quickly and without a database: per job its submission, first
readiness, end, preemptions, lost and idle GPU time; per queue the percentiles; over time
the GPU utilisation and the queue depth. (The DuckDB projections answer the same questions
in SQL for one ledger's whole history.)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from events.codec import DecodeError, Envelope, decode_event
from events.model import (
    MILLI,
    JobCancelled,
    JobPreempted,
    JobSubmitted,
    JobTerminated,
    JobUnschedulable,
    NodeRegistered,
    NodeRemoved,
    PodFinished,
    PodsAllocated,
    PodStarted,
)
from events.port import LedgerReader

HOUR_MS = 3_600_000


@dataclass(slots=True)
class JobRecord:
    """One job's fate."""

    job: str
    queue: str
    gpus: int
    submitted: int
    ready: int | None = None
    finished: int | None = None
    succeeded: bool = False
    preemptions: int = 0
    lost_gpu_ms: int = 0
    idle_gpu_ms: int = 0
    """GPU time allocated to the job while its gang was not running (half-placed, starting)."""
    allocated_gpu_ms: int = 0
    unschedulable: str = ""
    # fold state
    _held: dict[str, int] = field(default_factory=dict)
    _since: dict[str, int] = field(default_factory=dict)
    _running_since: int | None = None
    _started: int = 0
    _pods: int = 0
    _min: int = 0

    @property
    def time_to_ready_ms(self) -> int | None:
        """Submission until the gang first ran."""
        return None if self.ready is None else self.ready - self.submitted

    @property
    def completion_ms(self) -> int | None:
        """Submission until every pod ended (jobs that ran to an end)."""
        if self.finished is None or self.ready is None:
            return None
        return self.finished - self.submitted


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
    _allocated: int = 0
    _pending: dict[str, int] = field(default_factory=dict)

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


def collect(records: Iterable[tuple[int, Envelope]]) -> LedgerMetrics:
    """Fold a ledger's records into per-job metrics and timelines."""
    m = LedgerMetrics()
    nodes: dict[str, int] = {}
    first = True
    for offset, env in records:
        if first:
            m.start = env.at
            first = False
        m.end = max(m.end, env.at)
        try:
            event = decode_event(env, offset)
        except DecodeError:
            continue
        at = env.at
        match event:
            case NodeRegistered(node=name, gpus=count):
                nodes[name] = count * MILLI
                m.capacity_gpu = sum(nodes.values())
                m.utilisation.append((at, m._allocated, m.capacity_gpu))
            case NodeRemoved(node=name):
                nodes.pop(name, None)
                m.capacity_gpu = sum(nodes.values())
                m.utilisation.append((at, m._allocated, m.capacity_gpu))
            case JobSubmitted():
                if event.job in m.jobs:
                    continue
                m.jobs[event.job] = JobRecord(
                    job=event.job,
                    queue=event.queue,
                    gpus=sum(p.gpu_milli for p in event.pods),
                    submitted=at,
                    _pods=len(event.pods),
                    _min=event.min_members or len(event.pods),
                )
                _depth(m, event.queue, at, +1)
            case PodsAllocated(job=job_id, placements=placements):
                job = m.jobs.get(job_id)
                if job is None:
                    continue
                if not job._held:
                    _depth(m, job.queue, at, -1)
                for p in placements:
                    milli = sum(s.milli for s in p.gpus)
                    job._held[p.pod] = milli
                    job._since[p.pod] = at
                    m._allocated += milli
                m.utilisation.append((at, m._allocated, m.capacity_gpu))
            case PodStarted(job=job_id):
                job = m.jobs.get(job_id)
                if job is None:
                    continue
                job._started += 1
                if job._running_since is None and job._started >= min(job._min, len(job._held)):
                    job._running_since = at
                    if job.ready is None:
                        job.ready = at
                    # GPU time held before the gang ran was idle
                    for pod, since in job._since.items():
                        job.idle_gpu_ms += job._held.get(pod, 0) * (at - since) // MILLI
                        job._since[pod] = at
            case PodFinished(job=job_id, pod=pod, succeeded=ok):
                job = m.jobs.get(job_id)
                if job is None or pod not in job._held:
                    continue
                _release(m, job, pod, at)
                if not job._held:
                    job.finished = at
                    job.succeeded = ok
                m.utilisation.append((at, m._allocated, m.capacity_gpu))
            case JobPreempted(job=job_id, lost_gpu_ms=lost):
                job = m.jobs.get(job_id)
                if job is None:
                    continue
                job.preemptions += 1
                job.lost_gpu_ms += lost
                for pod in list(job._held):
                    _release(m, job, pod, at)
                job._running_since = None
                job._started = 0
                _depth(m, job.queue, at, +1)
                m.utilisation.append((at, m._allocated, m.capacity_gpu))
            case JobCancelled(job=job_id) | JobTerminated(job=job_id):
                # (A terminated job's survivors are held until evicted; they count as
                # released here, as the job's share of the cluster ends with it.)
                job = m.jobs.get(job_id)
                if job is None or job.finished is not None:
                    continue
                if isinstance(event, JobTerminated):
                    job.succeeded = False
                if not job._held:
                    _depth(m, job.queue, at, -1)
                for pod in list(job._held):
                    _release(m, job, pod, at)
                job.finished = at
                m.utilisation.append((at, m._allocated, m.capacity_gpu))
            case JobUnschedulable(job=job_id, final=True, reason=reason):
                job = m.jobs.get(job_id)
                if job is not None:
                    job.unschedulable = reason
                    _depth(m, job.queue, at, -1)
            case _:
                pass
    return m


def _release(m: LedgerMetrics, job: JobRecord, pod: str, at: int) -> None:
    milli = job._held.pop(pod)
    since = job._since.pop(pod, at)
    job.allocated_gpu_ms += milli * (at - since) // MILLI
    if job._running_since is None:
        job.idle_gpu_ms += milli * (at - since) // MILLI
    m._allocated -= milli


def _depth(m: LedgerMetrics, queue: str, at: int, delta: int) -> None:
    m._pending[queue] = m._pending.get(queue, 0) + delta
    m.depth.setdefault(queue, []).append((at, m._pending[queue]))


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
