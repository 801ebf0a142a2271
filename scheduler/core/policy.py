"""The scheduling cycle: ``cycle(state, now) -> decisions``.

Two policies share the state, the statement and the fold:

``gpuledger``
    the hierarchical gang policy. Fair shares are divided once per cycle; then, queue by
    queue in KAI-Scheduler's order (under deserved quota first, queue priority, lowest
    share of fair share, name), the head job of the queue (priority, then age) is
    admitted against every ancestor's limit, placed all-or-nothing by bin packing, and
    if it does not fit and its queue is entitled, room is made by **reclaim** (from
    queues above their fair share) or **preempt** (strictly lower priority in the same
    queue), choosing the victims that lose the least work and never evicting for a gang
    that would still not fit. A queue whose head cannot start is done for the cycle
    (first-in-first-out by priority: a big gang is not starved by smaller ones behind it).
    A job that can never fit the cluster as it stands is rejected at once with the reason.

``fifo``
    a faithful model of the default kube-scheduler: no queues, no gangs, no preemption.
    Pods are placed one by one in priority-then-creation order on the least allocated
    node; a pod that does not fit is skipped, so gangs can hold GPUs half-placed. A
    fractional GPU request takes a whole device (``nvidia.com/gpu`` is an integer).

Every decision is applied to the state as it is made, so later steps of the same cycle
see it; the caller appends the returned decisions to the ledger after the inputs.
"""

from __future__ import annotations

from collections.abc import Callable

from events.model import (
    MILLI,
    CycleCompleted,
    Event,
    JobPreempted,
    JobUnschedulable,
    PodPlacement,
    PodsAllocated,
    PodSpec,
)
from scheduler.core.apply import apply, lost_work
from scheduler.core.fairshare import Shares, fair_shares
from scheduler.core.placement import (
    Statement,
    binpack_score,
    effective_gpu_milli,
    fits_capacity,
    selector_matches,
    spread_score,
)
from scheduler.core.state import (
    ACTIVE,
    PENDING,
    UNLIMITED,
    Job,
    Node,
    Queue,
    State,
    node_from_capacity,
)

POLICIES = ("gpuledger", "fifo")

Emit = Callable[[Event], None]


def cycle(state: State, now: int) -> list[Event]:
    """Run one scheduling cycle at ``now``; return (and apply) its decisions.

    The last decision is always ``CycleCompleted``, which marks the cycle's boundary in
    the ledger so replay can run the very same cycles.
    """
    state.now = max(state.now, now)
    decisions: list[Event] = []

    def emit(event: Event) -> None:
        decisions.append(event)
        apply(state, event, state.now)

    if state.policy == "fifo":
        state.fresh.clear()  # kube-scheduler never rejects: a pod that cannot fit waits
        if state.dirty:
            _fifo(state, emit)
    else:
        if state.fresh:
            _reject_impossible(state, emit)
        if state.dirty:
            _gang_policy(state, emit)
    # A cycle runs until nothing more can start; the next one would change nothing
    # until an input makes the state dirty again.
    state.dirty = False
    count = len(decisions)
    emit(CycleCompleted(decisions=count))
    return decisions


def gpus(milli: int) -> str:
    """Milli-GPUs for people: ``2``, ``0.5``."""
    if milli % MILLI == 0:
        return str(milli // MILLI)
    return f"{milli / MILLI:g}"


# --------------------------------------------------------------------------- never fits


def _reject_impossible(state: State, emit: Emit) -> None:
    fresh, state.fresh = state.fresh, []
    shares: Shares | None = None
    for job_id in fresh:
        job = state.jobs.get(job_id)
        if job is None or job.status != PENDING:
            continue
        reason = _static_reason(state, job)
        if reason is None:
            empty = _empty_cluster(state)
            stmt = Statement(empty)
            if stmt.place_gang(job, _required(job)) is None:
                need = job.request[0]
                reason = (
                    f"gang of {_required(job)} pods needing {gpus(need)} GPUs cannot be "
                    f"packed onto the cluster even when it is empty "
                    f"({gpus(sum(n.gpus for n in empty.values()) * MILLI)} schedulable GPUs "
                    f"on {len(empty)} nodes)"
                )
            stmt.undo_all()
        if reason is None and not job.preemptible:
            if shares is None:
                shares = fair_shares(state)
            deserved = shares.deserved.get(job.queue, [0, 0, 0])[0]
            if job.request[0] > deserved:
                reason = (
                    f"non-preemptible job needs {gpus(job.request[0])} GPUs but queue "
                    f"'{job.queue}' deserves only {gpus(deserved)}; non-preemptible work "
                    f"runs only within deserved quota (lower its priority class or raise "
                    f"the quota)"
                )
        if reason is not None:
            emit(JobUnschedulable(job=job.job, queue=job.queue, reason=reason, final=True))


def _empty_cluster(state: State) -> dict[str, Node]:
    """The schedulable nodes with nothing on them (cached until a node event)."""
    version, nodes = state.empty_nodes
    if version != state.topology:
        nodes = {
            n.name: node_from_capacity(
                n.name, n.gpus, n.cpu_milli, n.memory_mib, n.labels, n.gpu_model
            )
            for n in state.nodes.values()
            if not n.cordoned
        }
        state.empty_nodes = (state.topology, nodes)
    return nodes


def _static_reason(state: State, job: Job) -> str | None:
    queue = state.queues.get(job.queue)
    if queue is None:
        return f"queue '{job.queue}' does not exist"
    if queue.children:
        return f"queue '{job.queue}' has child queues; submit to one of {queue.children}"
    gpu, cpu, memory = job.request
    for q in state.ancestors(job.queue):
        for amount, limit, what in (
            (gpu, q.limit.gpu_milli, "GPUs"),
            (cpu, q.limit.cpu_milli, "millicores"),
            (memory, q.limit.memory_mib, "MiB"),
        ):
            if limit != UNLIMITED and limit >= 0 and amount > limit:
                shown = gpus(amount) if what == "GPUs" else str(amount)
                cap = gpus(limit) if what == "GPUs" else str(limit)
                return f"job needs {shown} {what} but queue '{q.name}' is limited to {cap}"
    nodes = [n for n in state.nodes.values() if not n.cordoned]
    if not nodes:
        return "the cluster has no schedulable nodes"
    for pod in job.pods[: _required(job)]:
        reason = _pod_never_fits(nodes, pod)
        if reason is not None:
            return reason
    return None


def _pod_never_fits(nodes: list[Node], pod: PodSpec) -> str | None:
    selector = pod.node_selector
    matching = [n for n in nodes if selector_matches(n, selector)] if selector else nodes
    if not matching:
        wanted = ", ".join(f"{k}={v}" for k, v in sorted(pod.node_selector.items()))
        return f"pod '{pod.name}': node selector {{{wanted}}} matches no schedulable node"
    if any(fits_capacity(n, pod, pod.gpu_milli) for n in matching):
        return None
    largest = max(n.gpus for n in matching)
    if pod.gpu_milli > largest * MILLI:
        return (
            f"pod '{pod.name}' needs {gpus(pod.gpu_milli)} GPUs but the largest matching "
            f"node has {largest}"
        )
    return (
        f"pod '{pod.name}' ({pod.cpu_milli} millicores, {pod.memory_mib} MiB) is larger "
        f"than every matching node"
    )


def _required(job: Job) -> int:
    return job.min_members or len(job.pods)


# --------------------------------------------------------------------------- gang policy


def _gang_policy(state: State, emit: Emit) -> None:
    shares = fair_shares(state)
    blocked: dict[str, None] = {}
    leaves = [q for q in state.leaf_queues() if q.pending]
    while True:
        candidates = [q for q in leaves if q.pending and q.name not in blocked]
        if not candidates:
            return
        queue = min(candidates, key=lambda q: _queue_order(q, shares))
        job = state.jobs[queue.pending[0][2]]
        if not _try_job(state, queue, job, shares, emit):
            blocked[queue.name] = None


def _queue_order(queue: Queue, shares: Shares) -> tuple[int, int, int, str]:
    """KAI's queue order: under deserved first, priority, share of fair share, name."""
    allocated = queue.allocated[0]
    deserved = shares.deserved[queue.name][0]
    fair = shares.fair[queue.name][0]
    under_deserved = 0 if allocated < deserved else 1
    ratio = allocated * 1_000_000 // fair if fair > 0 else 1 << 62
    return (under_deserved, -queue.priority, ratio, queue.name)


def _admission_reason(state: State, queue: Queue, job: Job, shares: Shares) -> str | None:
    gpu, cpu, memory = job.request
    for q in state.ancestors(queue.name):
        for index, amount, limit, what in (
            (0, gpu, q.limit.gpu_milli, "GPUs"),
            (1, cpu, q.limit.cpu_milli, "millicores"),
            (2, memory, q.limit.memory_mib, "MiB"),
        ):
            if limit != UNLIMITED and limit >= 0 and q.allocated[index] + amount > limit:
                fmt = gpus if what == "GPUs" else str
                return (
                    f"queue '{q.name}' is at its limit: {fmt(q.allocated[index])} of "
                    f"{fmt(limit)} {what} in use, job needs {fmt(amount)}"
                )
    if not job.preemptible:
        for q in state.ancestors(queue.name):
            deserved = shares.deserved[q.name][0]
            if q.allocated[0] + gpu > deserved:
                return (
                    f"non-preemptible job waits for deserved quota of '{q.name}': "
                    f"{gpus(q.allocated[0])} of {gpus(deserved)} GPUs in use, "
                    f"job needs {gpus(gpu)}"
                )
    return None


def _try_job(state: State, queue: Queue, job: Job, shares: Shares, emit: Emit) -> bool:
    reason = _admission_reason(state, queue, job, shares)
    if reason is not None:
        _note_reason(job, reason, emit)
        return False
    required = _required(job)
    stmt = Statement(state.nodes, score=binpack_score)
    placements = stmt.place_gang(job, required)
    victims: list[tuple[Job, str]] = []
    if placements is None:
        placements, victims = _make_room(state, queue, job, shares, stmt, required)
    if placements is None:
        _note_reason(job, _capacity_reason(state, job, required), emit)
        return False
    stmt.undo_all()
    for victim, rule in victims:
        lost, kept = lost_work(victim, state.now)
        emit(
            JobPreempted(
                job=victim.job,
                queue=victim.queue,
                pods=tuple(victim.placements),
                preemptor=job.job,
                preemptor_queue=job.queue,
                rule="reclaim" if rule == "reclaim" else "preempt",
                lost_gpu_ms=lost,
                checkpointed_ms=kept,
            )
        )
    emit(PodsAllocated(job=job.job, queue=job.queue, placements=tuple(placements)))
    return True


def _note_reason(job: Job, reason: str, emit: Emit) -> None:
    """Record why a job waits, only when the reason changed (not every cycle)."""
    if reason != job.reason:
        emit(JobUnschedulable(job=job.job, queue=job.queue, reason=reason))


def _capacity_reason(state: State, job: Job, required: int) -> str:
    stmt = Statement(state.nodes)
    nodes = list(state.nodes.values())
    fitted = 0
    for pod in job.pods[:required]:
        if stmt.place(job.job, pod, nodes) is None:
            break
        fitted += 1
    stmt.undo_all()
    need = job.request[0]
    return (
        f"waiting for capacity: gang needs {required} pods ({gpus(need)} GPUs), "
        f"free capacity fits {fitted} of them now"
    )


def _make_room(
    state: State, queue: Queue, job: Job, shares: Shares, stmt: Statement, required: int
) -> tuple[list[PodPlacement] | None, list[tuple[Job, str]]]:
    """Try reclaim, then preempt; the victims are the fewest that lose the least work."""
    attempts: list[tuple[str, list[Job]]] = []
    if state.reclaim:
        attempts.append(("reclaim", _reclaim_candidates(state, queue, job, shares)))
    if state.preempt:
        attempts.append(("preempt", _preempt_candidates(state, queue, job)))
    for rule, candidates in attempts:
        if not candidates:
            continue
        chosen: list[Job] = []
        placements: list[PodPlacement] | None = None
        for victim in candidates:
            stmt.evict(victim)
            chosen.append(victim)
            placements = stmt.place_gang(job, required)
            if placements is not None:
                break
        if placements is None:
            stmt.undo_all()  # never evict for a gang that still would not fit
            continue
        # Never more victims than needed: drop any whose eviction turns out unnecessary.
        for victim in list(reversed(chosen[:-1])):
            trial = [v for v in chosen if v is not victim]
            stmt.undo_all()
            for v in trial:
                stmt.evict(v)
            attempt = stmt.place_gang(job, required)
            if attempt is not None:
                chosen, placements = trial, attempt
        stmt.undo_all()
        for v in chosen:
            stmt.evict(v)
        placements = stmt.place_gang(job, required)
        assert placements is not None
        return placements, [(v, rule) for v in chosen]
    return None, []


def _victim_order(state: State) -> Callable[[Job], tuple[int, int, int, str]]:
    def key(victim: Job) -> tuple[int, int, int, str]:
        lost, _ = lost_work(victim, state.now)
        return (lost, -(victim.started_at or state.now), -victim.seq, victim.job)

    return key


def _reclaim_candidates(state: State, queue: Queue, job: Job, shares: Shares) -> list[Job]:
    """Victims in other queues that reclaim may take from, cheapest first.

    Two strategies, as KAI-Scheduler's: **fair-share reclaim** — the reclaiming queue stays
    within its fair share, and each victim queue is above its fair share and keeps a
    saturation (allocated / fair share) at least the reclaimer's after the move, so the
    queues' order is preserved; **quota reclaim** — the reclaiming queue stays within its
    deserved quota and takes only from queues above their deserved quota.
    """
    need = job.request[0]
    after = queue.allocated[0] + need
    fair = shares.fair[queue.name][0]
    by_fair_share = after <= fair
    by_quota = after <= shares.deserved[queue.name][0]
    if not (by_fair_share or by_quota):
        return []
    candidates: list[Job] = []
    for other in state.leaf_queues():
        if other.name == queue.name or not other.active:
            continue
        over_fair = other.allocated[0] > shares.fair[other.name][0]
        over_quota = other.allocated[0] > shares.deserved[other.name][0]
        if not ((by_fair_share and over_fair) or (by_quota and over_quota)):
            continue
        for victim_id in other.active:
            victim = state.jobs[victim_id]
            if victim.preemptible and victim.status in ACTIVE:
                candidates.append(victim)
    candidates.sort(key=_victim_order(state))
    taken: dict[str, int] = {}
    allowed: list[Job] = []
    for victim in candidates:
        other = state.queues[victim.queue]
        left = other.allocated[0] - taken.get(other.name, 0) - _held_gpu(victim)
        keeps_order = left * max(fair, 1) >= after * max(shares.fair[other.name][0], 1)
        quota_ok = by_quota and other.allocated[0] > shares.deserved[other.name][0]
        if (by_fair_share and keeps_order) or quota_ok:
            taken[other.name] = taken.get(other.name, 0) + _held_gpu(victim)
            allowed.append(victim)
    return allowed


def _preempt_candidates(state: State, queue: Queue, job: Job) -> list[Job]:
    """Preemptible jobs of the same queue with strictly lower priority."""
    candidates = [
        state.jobs[v]
        for v in queue.active
        if state.jobs[v].preemptible
        and state.jobs[v].priority < job.priority
        and state.jobs[v].status in ACTIVE
    ]
    candidates.sort(key=_victim_order(state))
    return candidates


def _held_gpu(job: Job) -> int:
    return sum(slot.milli for p in job.placements.values() for slot in p.gpus)


# --------------------------------------------------------------------------- fifo


def _fifo(state: State, emit: Emit) -> None:
    stmt = Statement(state.nodes, fractional=False, score=spread_score)
    nodes = list(state.nodes.values())
    failed: list[tuple[int, int, int]] = []
    for _, _, job_id in list(state.pending):
        job = state.jobs[job_id]
        placed: list[PodPlacement] = []
        for pod in job.pods:
            if pod.name in job.placements or not _may_fit(pod, failed):
                continue
            placement = stmt.place(job.job, pod, nodes)
            if placement is None:
                if not pod.node_selector and len(failed) < 16:
                    failed.append((effective_gpu_milli(pod, False), pod.cpu_milli, pod.memory_mib))
                continue
            placed.append(placement)
        if placed:
            stmt.undo_all()
            emit(PodsAllocated(job=job.job, queue=job.queue, placements=tuple(placed)))


def _may_fit(pod: PodSpec, failed: list[tuple[int, int, int]]) -> bool:
    """False if a pod no larger than this one already failed this cycle.

    Within a cycle free capacity only shrinks, so a pod at least as large in every
    resource as one that did not fit cannot fit either.
    """
    gpu = effective_gpu_milli(pod, False)
    return not any(gpu >= g and pod.cpu_milli >= c and pod.memory_mib >= m for g, c, m in failed)
