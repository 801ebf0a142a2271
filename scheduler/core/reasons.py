"""Why a job waits, in words and as a kind: the reasons the policy records
(``job_unschedulable``).

A waiting job gets one reason per cycle, recorded only when it changed, so the ledger
holds a new record when the cause of the wait changes rather than every cycle. Each
reason names one blocking cause (``job_unschedulable.cause``, docs/policy.md §7); a
reservation's reason carries the time it is promised to start (``start``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, NamedTuple

from events.ledgertime import format_at, is_wall_clock
from events.model import MILLI, JobUnschedulable, PodSpec
from scheduler.core.state import Job

if TYPE_CHECKING:
    from scheduler.core.session import Emit

NEVER_FITS: Final = "never_fits"
"""The job can never start on the cluster as it stands (final)."""
LIMIT: Final = "limit"
"""Its queue, or an ancestor, is at its limit."""
QUOTA: Final = "quota"
"""Non-preemptible work beyond the deserved quota."""
SHARE: Final = "share"
"""Beyond its queue's deserved quota or fair share, and what it needs is held by work
its queue may not reclaim (in-quota work of other queues, or any work while over share)."""
MISMATCH: Final = "mismatch"
"""Enough GPUs are free, but not where its pods may go (selector, taints, CPU, memory,
one node's room, one topology domain)."""
RESERVED: Final = "reserved"
"""It fits the free capacity only on nodes another job's reservation holds."""
BEHIND: Final = "behind"
"""Behind its queue's blocked head, it does not fit the gap."""
RESERVATION: Final = "reservation"
"""It holds a reservation of its own and starts when it falls due."""
CAPACITY: Final = "capacity"
"""Not enough free capacity, with nothing it may reclaim or reserve."""
BACKOFF: Final = "backoff"
"""Backing off after failed binds."""


class Reason(NamedTuple):
    """Why a job waits: the words, the kind (``cause``) and, for a reservation, the time
    it is promised to start (-1: none, or not known). A tuple: admission builds one for
    every job a limit or quota holds back, thousands a cycle on a long backlog."""

    text: str
    cause: str
    start: int = -1


def gpus(milli: int) -> str:
    """Milli-GPUs for people: ``2``, ``0.5``."""
    if milli % MILLI == 0:
        return str(milli // MILLI)
    return f"{milli / MILLI:g}"


def moment(ms: int) -> str:
    """A ledger time for people, as every tool writes one (``events.ledgertime.format_at``):
    ``+01:00:00`` on a simulated ledger, ``2026-12-03T06:00:00.000Z`` on a live one."""
    return format_at(ms, is_wall_clock(ms))


def amount(resource: int, value: int) -> str:
    """A quantity of resource 0 (milli-GPUs, shown as GPUs), 1 (millicores) or 2 (MiB)."""
    return gpus(value) if resource == 0 else str(value)


UNITS: Final = ("GPUs", "millicores", "MiB")
"""The unit each resource index is shown in (see ``amount``)."""


def note_reason(job: Job, reason: Reason, emit: Emit) -> None:
    """Record why a job waits, only when the reason changed (not every cycle)."""
    if reason.text != job.reason:
        emit(
            JobUnschedulable(
                job=job.job,
                queue=job.queue,
                reason=reason.text,
                cause=reason.cause,
                start=reason.start,
            )
        )


def backoff_reason(job: Job) -> Reason:
    """A job whose bind failed waits out its backoff."""
    return Reason(
        f"backing off after {job.bind_failures} failed binds until {moment(job.backoff_until)}",
        BACKOFF,
    )


def capacity_text(required_pods: list[PodSpec], fitted: int) -> str:
    """How much of the gang the free capacity holds now."""
    return (
        f"waiting for capacity: gang needs {len(required_pods)} pods ({shape(required_pods)}), "
        f"free capacity fits {fitted} of them now"
    )


def shape(pods: list[PodSpec]) -> str:
    """``4×8 GPUs`` or ``16 GPUs`` for a list of pods."""
    sizes = {p.gpu_milli for p in pods}
    if len(sizes) == 1 and len(pods) > 1:
        return f"{len(pods)}×{gpus(pods[0].gpu_milli)} GPUs"
    return f"{gpus(sum(p.gpu_milli for p in pods))} GPUs"
