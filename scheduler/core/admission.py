"""Admission: which queue goes next, and whether its job may start under limits and quota.

``queue_order`` ranks the leaf queues (KAI-Scheduler's order); ``admission_reason`` says
why a job may not start now however much room there is: a queue's limit (the one limit
check, ``over_limit``, also serves the never-fits rule) or, for non-preemptible work,
its deserved quota. ``limit_excess`` says how much a job held back by a limit would have
to preempt from its own queue to start within every limit.
"""

from __future__ import annotations

from scheduler.core.fairshare import RESOURCES, Shares, bounded, limit_of
from scheduler.core.reasons import LIMIT, QUOTA, UNITS, Reason, amount, gpus
from scheduler.core.running import NEVER
from scheduler.core.state import Job, Queue, State


def queue_order(
    queue: Queue, shares: Shares, jobs: dict[str, Job]
) -> tuple[int, int, int, int, int, str]:
    """KAI's queue order: head within deserved, within fair share, priority, dominant
    share, age. Judging by the head job's request (not the queue's allocation alone)
    keeps a queue from borrowing beyond its quota in a cycle where another queue, still
    within its own, would then have to reclaim it back."""
    allocated = queue.allocated
    deserved = shares.deserved[queue.name]
    fair = shares.fair[queue.name]
    need = jobs[queue.pending[0][2]].request[0] if queue.pending else 0
    below_deserved = 0 if allocated[0] + need <= deserved[0] else 1
    below_fair = 0 if allocated[0] + need <= fair[0] else 1
    dominant = 0
    for index in range(3):
        if allocated[index]:
            share = allocated[index] * 1_000_000 // fair[index] if fair[index] > 0 else NEVER
            dominant = max(dominant, share)
    head_seq = queue.pending[0][1] if queue.pending else NEVER
    return (below_deserved, below_fair, -queue.priority, dominant, head_seq, queue.name)


def limited(state: State, leaf: str) -> bool:
    """Whether the leaf or an ancestor has a limit (else ``admission_reason`` can refuse
    only non-preemptible jobs)."""
    return any(
        bounded(limit_of(q, resource))
        for q in state.ancestors(leaf)
        for resource in range(RESOURCES)
    )


def over_limit(
    state: State, leaf: str, request: tuple[int, int, int], *, in_use: bool
) -> tuple[Queue, int, int] | None:
    """The first limit, from the leaf up, that ``request`` exceeds: (queue, resource
    index, limit), or None. With ``in_use`` the request comes on top of what each queue
    holds now; without, it is judged alone (can it ever fit under the limit?)."""
    for q in state.ancestors(leaf):
        for resource in range(RESOURCES):
            limit = limit_of(q, resource)
            held = q.allocated[resource] if in_use else 0
            if bounded(limit) and held + request[resource] > limit:
                return q, resource, limit
    return None


def limit_excess(state: State, leaf: str, request: tuple[int, int, int]) -> tuple[int, int, int]:
    """Per resource, the most by which ``request`` on top of what is held would exceed a
    limit of the leaf or an ancestor (0: within every limit). Jobs evicted from the leaf
    leave every ancestor, so evicting this much from the leaf brings every limit back
    within bounds."""
    excess = [0, 0, 0]
    for q in state.ancestors(leaf):
        for resource in range(RESOURCES):
            limit = limit_of(q, resource)
            if bounded(limit):
                over = q.allocated[resource] + request[resource] - limit
                excess[resource] = max(excess[resource], over)
    return excess[0], excess[1], excess[2]


def admission_reason(state: State, queue: Queue, job: Job, shares: Shares) -> Reason | None:
    """Why the job may not start now whatever the room (None: it may)."""
    hit = over_limit(state, queue.name, job.request, in_use=True)
    if hit is not None:
        q, resource, limit = hit
        return Reason(
            f"queue '{q.name}' is at its limit: {amount(resource, q.allocated[resource])} of "
            f"{amount(resource, limit)} {UNITS[resource]} in use, "
            f"job needs {amount(resource, job.request[resource])}"
            + (f" (its queue '{queue.name}' is under '{q.name}')" if q is not queue else ""),
            LIMIT,
        )
    return quota_reason(state, queue, job, shares)


def quota_reason(state: State, queue: Queue, job: Job, shares: Shares) -> Reason | None:
    """Why a non-preemptible job may not start within its deserved quota (None: it may,
    or the job is preemptible)."""
    if not job.preemptible:
        # Only non-preemptible work counts against the quota here: preemptible jobs of
        # the same queue can be preempted to make room.
        gpu = job.request[0]
        for q in state.ancestors(queue.name):
            deserved = shares.deserved[q.name][0]
            if q.allocated_np + gpu > deserved:
                return Reason(
                    f"non-preemptible job waits for deserved quota of '{q.name}': "
                    f"{gpus(q.allocated_np)} of {gpus(deserved)} GPUs held by "
                    f"non-preemptible jobs, job needs {gpus(gpu)}",
                    QUOTA,
                )
    return None
