"""Why a job waits, in words: the reasons the policy records (``job_unschedulable``).

A waiting job gets one reason per cycle, recorded only when it changed, so the ledger
holds a new record when the cause of the wait changes rather than every cycle.
"""

from __future__ import annotations

from events.model import MILLI, JobUnschedulable, PodSpec
from scheduler.core.placement import Statement, split_gang
from scheduler.core.running import NEVER
from scheduler.core.session import Emit
from scheduler.core.state import Job, State


def gpus(milli: int) -> str:
    """Milli-GPUs for people: ``2``, ``0.5``."""
    if milli % MILLI == 0:
        return str(milli // MILLI)
    return f"{milli / MILLI:g}"


def seconds(ms: int) -> str:
    """A time in ms for people: ``t=3600s``."""
    return f"t={ms / 1000:g}s"


def amount(resource: int, value: int) -> str:
    """A quantity of resource 0 (milli-GPUs, shown as GPUs), 1 (millicores) or 2 (MiB)."""
    return gpus(value) if resource == 0 else str(value)


UNITS = ("GPUs", "millicores", "MiB")
"""The unit each resource index is shown in (see ``amount``)."""


def note_reason(job: Job, reason: str, emit: Emit) -> None:
    """Record why a job waits, only when the reason changed (not every cycle)."""
    if reason != job.reason:
        emit(JobUnschedulable(job=job.job, queue=job.queue, reason=reason))


def backoff_reason(job: Job) -> str:
    """A job whose bind failed waits out its backoff."""
    return f"backing off after {job.bind_failures} failed binds until {seconds(job.backoff_until)}"


def capacity_reason(state: State, job: Job) -> str:
    """How much of the gang the free capacity holds now."""
    required_pods, _ = split_gang(job)
    fitted = 0
    with Statement(state.nodes, index=state.free_index()) as stmt:
        for pod in required_pods:
            if stmt.place(job.job, pod, None) is None:
                break
            fitted += 1
    return (
        f"waiting for capacity: gang needs {len(required_pods)} pods ({shape(required_pods)}), "
        f"free capacity fits {fitted} of them now"
    )


def reservation_reason(state: State, nodes: int, start: int) -> str:
    """A blocked head holds a reservation of ``nodes`` nodes from ``start``."""
    if start == NEVER:
        when = "when running jobs end"
    elif start <= state.now:
        # Held by jobs past their expected runtime: a time here would be `now`, a new
        # reason (and ledger record) every cycle until they end.
        when = "as soon as overrunning jobs end"
    else:
        when = f"at {seconds(start)}"
    return f"waiting for a reservation of {nodes} nodes {when}; smaller jobs backfill the gap"


def shape(pods: list[PodSpec]) -> str:
    """``4×8 GPUs`` or ``16 GPUs`` for a list of pods."""
    sizes = {p.gpu_milli for p in pods}
    if len(sizes) == 1 and len(pods) > 1:
        return f"{len(pods)}×{gpus(pods[0].gpu_milli)} GPUs"
    return f"{gpus(sum(p.gpu_milli for p in pods))} GPUs"
