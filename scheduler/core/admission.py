"""Admission: which queue goes next, and whether its job may start under limits and quota.

``queue_order`` ranks the leaf queues (KAI-Scheduler's order); ``admission_reason`` says
why a job may not start now however much room there is: a queue's limit (the one limit
check, ``over_limit``, also serves the never-fits rule) or, for non-preemptible work,
its deserved quota. ``limit_excess`` says how much a job held back by a limit would have
to preempt from its own queue to start within every limit.
"""

from __future__ import annotations

from typing import Final

from scheduler.core.fairshare import RESOURCES, Shares, bounded, capacity, limit_of
from scheduler.core.headroom import Headroom
from scheduler.core.reasons import LIMIT, QUOTA, UNITS, Reason, amount, gpus
from scheduler.core.running import NEVER
from scheduler.core.state import Job, Queue, State


def queue_order(queue: Queue, shares: Shares, head: Job) -> tuple[int, int, int, int, int, str]:
    """KAI's queue order: head within deserved, within fair share, priority, dominant
    share, age. Judging by the head job's request (not the queue's allocation alone)
    keeps a queue from borrowing beyond its quota in a cycle where another queue, still
    within its own, would then have to reclaim it back. ``head`` is the job the queue
    tries next (``allocate._heads``)."""
    allocated = queue.allocated
    deserved = shares.deserved[queue.name]
    fair = shares.fair[queue.name]
    need = head.request[0]
    below_deserved = 0 if allocated[0] + need <= deserved[0] else 1
    below_fair = 0 if allocated[0] + need <= fair[0] else 1
    dominant = 0
    for index in range(3):
        if allocated[index]:
            share = allocated[index] * 1_000_000 // fair[index] if fair[index] > 0 else NEVER
            dominant = max(dominant, share)
    head_seq = queue.pending[0][1] if queue.pending else NEVER
    return (below_deserved, below_fair, -queue.priority, dominant, head_seq, queue.name)


_RATIO: Final = 1_000_000
"""Shares are compared in parts per million (integer arithmetic)."""


def kai_ranked(
    state: State, leaves: list[Queue], shares: Shares, heads: dict[str, Job]
) -> list[Queue]:
    """The leaves in KAI-Scheduler's queue order (``queue_order: kai``), level by level:
    the top-level queues are ranked, each by its own share and its best head job (the head
    of its first leaf), then the children inside each the same way, down to the leaves.
    Only queues with a leaf among ``leaves`` take part; the order is worked out again
    after each placement, as every order is."""
    below: dict[str, dict[str, Queue]] = {}
    for leaf in leaves:
        child = leaf
        for parent in state.ancestors(leaf.name)[1:]:
            below.setdefault(parent.name, {})[child.name] = child
            child = parent
        below.setdefault("", {})[child.name] = child
    rank = {name: i for i, name in enumerate(state.queues)}
    modelled = tuple(r for r, total in enumerate(capacity(state)) if total > 0) or (0,)

    def order(children: dict[str, Queue]) -> list[Queue]:
        entries = []
        for queue in children.values():
            inside = order(below[queue.name]) if queue.name in below else [queue]
            head = heads[inside[0].name]
            key = _kai_key(queue, head.request, shares, modelled)
            entries.append(((*key, rank.get(queue.name, 0), queue.name), inside))
        entries.sort(key=lambda entry: entry[0])
        return [leaf for _, inside in entries for leaf in inside]

    return order(below.get("", {}))


def _kai_key(
    queue: Queue, request: tuple[int, int, int], shares: Shares, modelled: tuple[int, ...]
) -> tuple[int, ...]:
    """KAI-Scheduler's queue comparison, in its order: not above its fair share (every
    resource), within its deserved quota with the head job, higher priority, no resource
    held where its allocatable share is 0, lower dominant share with the head job, then
    without it, smaller allocatable share (creation order and name follow)."""
    held = queue.allocated
    fair = shares.fair[queue.name]
    deserved = shares.deserved[queue.name]
    allocatable = []
    for r in range(RESOURCES):
        most = max(deserved[r], fair[r])
        limit = limit_of(queue, r)
        allocatable.append(min(most, limit) if bounded(limit) else most)
    over_fair = all(fair[r] < held[r] for r in modelled)
    starved = all(held[r] + request[r] <= deserved[r] for r in modelled)
    with_job = [held[r] + request[r] for r in range(RESOURCES)]
    zero_share = any(allocatable[r] == 0 and with_job[r] > 0 for r in modelled)
    return (
        int(over_fair),
        int(not starved),
        -queue.priority,
        int(zero_share),
        _dominant(with_job, allocatable, modelled),
        _dominant(list(held), allocatable, modelled),
        *(allocatable[r] for r in range(RESOURCES)),
    )


def _dominant(held: list[int], allocatable: list[int], modelled: tuple[int, ...]) -> int:
    """The largest held ÷ allocatable share over the resources (ppm); a resource held
    with no allocatable share counts as NEVER."""
    share = 0
    for r in modelled:
        if allocatable[r] > 0:
            share = max(share, held[r] * _RATIO // allocatable[r])
        elif held[r] > 0:
            return NEVER
    return share


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


def admission_headroom(state: State, queue: Queue, shares: Shares) -> Headroom:
    """What ``admission_reason`` compares a job's request with, folded over the queue's
    chain once: a job is held back exactly when ``admission_held`` says so. It changes
    only when what the queues hold changes (a placement or an eviction)."""
    room = [NEVER, NEVER, NEVER]
    quota = NEVER
    for q in state.ancestors(queue.name):
        for resource in range(RESOURCES):
            limit = limit_of(q, resource)
            if bounded(limit):
                room[resource] = min(room[resource], limit - q.allocated[resource])
        quota = min(quota, shares.deserved[q.name][0] - q.allocated_np)
    return room[0], room[1], room[2], quota


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
