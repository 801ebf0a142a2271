"""The scheduling cycle: ``cycle(state, now) -> decisions``.

``gpuledger`` — the hierarchical gang policy (docs/policy.md explains every rule):

1. stale gangs past their grace period are evicted (``stale-gang``);
2. fair shares are divided once per cycle (with time-based usage when configured);
3. queue by queue in KAI-Scheduler's order, each queue's next eligible job is admitted
   against every ancestor's limit (non-preemptible work only within deserved quota),
   placed all-or-nothing through a statement, and if it does not fit room is made by
   **reclaim**, **preempt** or by evicting jobs backfilled under its own reservation;
4. a job that still cannot start reserves the nodes it will get at the earliest time it
   can (EASY backfill); later jobs may use the gap only if they end before that time or
   are preemptible — without backfill, its queue waits behind it for this cycle;
5. a job that can never fit the cluster as it stands is rejected at once with a reason.

``fifo`` and ``drf`` are the baselines in ``scheduler.core.baselines``.

Every decision is applied to the state as it is made, so later steps of the same cycle
see it; the caller appends the returned decisions to the ledger after the inputs.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from events.model import (
    MILLI,
    CycleCompleted,
    Event,
    JobPreempted,
    JobTerminated,
    JobUnschedulable,
    PodPlacement,
    PodsAllocated,
    PodSpec,
)
from scheduler.core.apply import apply, lost_work
from scheduler.core.fairshare import Shares, accrue_usage, fair_shares
from scheduler.core.placement import (
    Statement,
    binpack_score,
    fits_capacity,
    gang_demand,
    may_fit,
    selector_matches,
    split_gang,
    spread_score,
)
from scheduler.core.running import VictimItem, gpu_spots, held_gpu
from scheduler.core.state import (
    ACTIVE,
    PENDING,
    RUNNING,
    UNLIMITED,
    FreeIndex,
    Job,
    Node,
    Queue,
    State,
    node_from_capacity,
)

REVISION = 5
"""Semantics revision of this core; recorded in ``policy_configured`` by writers."""

POLICIES = ("gpuledger", "drf", "fifo")

Emit = Callable[[Event], None]
NEVER = 1 << 62


def cycle(state: State, now: int) -> list[Event]:
    """Run one scheduling cycle at ``now``; return (and apply) its decisions.

    The last decision is always ``CycleCompleted``, which marks the cycle's boundary in
    the ledger so replay can run the very same cycles.
    """
    from scheduler.core import baselines  # noqa: PLC0415  # baselines import this module

    state.now = max(state.now, now)
    decisions: list[Event] = []

    def emit(event: Event) -> None:
        decisions.append(event)
        apply(state, event, state.now)

    due = state.wakeup is not None and state.wakeup <= state.now
    if due:
        state.wakeup = None
    if state.broken:
        _end_broken(state, emit)
    if state.policy == "fifo":
        # kube-scheduler never rejects: a pod that cannot fit waits, fresh or not.
        if state.dirty:
            baselines.fifo(state, emit)
    else:
        if state.config.half_life_ms > 0:
            accrue_usage(state)
        if state.fresh:
            _reject_impossible(state, emit)
        if state.dirty or due:
            if state.policy == "drf":
                baselines.drf(state, emit)
            else:
                _gang_policy(state, emit)
    if state.config.half_life_ms > 0:
        state.usage_alloc = {q.name: q.allocated[0] for q in state.leaf_queues()}
    # A cycle runs until nothing more can start; the next one would change nothing until
    # an input makes the state dirty again or a time-based rule falls due. Applying
    # CycleCompleted records that (clean, no fresh jobs), here as in any fold of the ledger.
    emit(CycleCompleted(decisions=len(decisions)))
    return decisions


def _end_broken(state: State, emit: Emit) -> None:
    """End every job that can no longer run as placed (``State.broken``), in the order they
    broke: the binder evicts its pods still in the cluster (those on a live node that have
    not finished, and those left on a removed node)."""
    for job_id, reason in list(state.broken.items()):
        job = state.jobs.get(job_id)
        if job is None or job.status not in ACTIVE:
            del state.broken[job_id]
            continue
        pods = tuple(
            p.pod
            for p in job.placements.values()
            if p.pod not in job.finished or p.node not in state.nodes
        )
        emit(JobTerminated(job=job_id, queue=job.queue, pods=pods, reason=reason))


def gpus(milli: int) -> str:
    """Milli-GPUs for people: ``2``, ``0.5``."""
    if milli % MILLI == 0:
        return str(milli // MILLI)
    return f"{milli / MILLI:g}"


def seconds(ms: int) -> str:
    """A time in ms for people: ``t=3600s``."""
    return f"t={ms / 1000:g}s"


def _wake(state: State, at: int) -> None:
    if state.wakeup is None or at < state.wakeup:
        state.wakeup = at


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
            empty, empty_index, fits = _empty_cluster(state)
            # A plain gang that needs all its pods fits or not by its pod sizes alone:
            # remembered per topology.
            whole = _gang_shape(job, False) and job.min_members in (0, len(job.pods))
            sizes = tuple(p.gpu_milli for p in job.pods) if whole else None
            fit = fits.get(sizes) if sizes is not None else None
            if fit is None:
                stmt = Statement(empty, index=empty_index)
                fit = stmt.place_gang(job) is not None
                stmt.undo_all()
                if sizes is not None:
                    fits[sizes] = fit
            if not fit:
                reason = (
                    f"gang of {_required(job)} pods needing {gpus(job.request[0])} GPUs cannot "
                    f"be packed onto the cluster even when it is empty "
                    f"({gpus(sum(n.gpus for n in empty.values()) * MILLI)} schedulable GPUs "
                    f"on {len(empty)} nodes"
                    + (f", in one '{job.topology_key}' domain" if job.topology_required else "")
                    + ")"
                )
        if reason is None and not job.preemptible and state.policy == "gpuledger":
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


def _empty_cluster(
    state: State,
) -> tuple[dict[str, Node], FreeIndex, dict[tuple[int, ...], bool]]:
    """The schedulable nodes with nothing on them, and their free index (cached until a
    node event; statements on them roll back, so both stay empty)."""
    version, nodes, index, fits = state.empty_nodes
    if version != state.topology or index is None:
        nodes = {}
        for n in state.nodes.values():
            if n.cordoned:
                continue
            copy = node_from_capacity(
                n.name, n.gpus, n.cpu_milli, n.memory_mib, n.labels, n.gpu_model
            )
            copy.taints = n.taints
            nodes[n.name] = copy
        index = FreeIndex.of(nodes)
        fits = {}
        state.empty_nodes = (state.topology, nodes, index, fits)
    return nodes, index, fits


def _static_reason(state: State, job: Job) -> str | None:
    queue = state.queues.get(job.queue)
    if queue is None:
        return f"queue '{job.queue}' does not exist"
    if queue.children:
        return f"queue '{job.queue}' has child queues; submit to one of {queue.children}"
    gpu, cpu, memory = job.request
    if state.policy == "gpuledger":
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
    required, _ = split_gang(job)
    for pod in required:
        reason = _pod_never_fits(nodes, pod)
        if reason is not None:
            return reason
    return None


def _pod_never_fits(nodes: list[Node], pod: PodSpec) -> str | None:
    selector = pod.node_selector
    matching = [n for n in nodes if selector_matches(n, selector)] if selector else nodes
    if not matching:
        wanted = ", ".join(f"{k}={v}" for k, v in sorted(selector.items()))
        return f"pod '{pod.name}': node selector {{{wanted}}} matches no schedulable node"
    if pod.gpu_memory_mib and not pod.gpu_milli:
        largest_memory = max(n.gpu_memory_mib for n in matching)
        if pod.gpu_memory_mib > largest_memory:
            return (
                f"pod '{pod.name}' needs {pod.gpu_memory_mib} MiB of one GPU but the largest "
                f"matching GPU has {largest_memory} MiB"
            )
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


# --------------------------------------------------------------------------- the gang policy


@dataclass(slots=True)
class Reservation:
    """Nodes held for a blocked job from ``start`` (NEVER: unknown) on."""

    job: str
    start: int
    nodes: dict[str, None]


BACKFILL_TRIES = 64
"""Failed backfill attempts per queue and cycle before the queue stops looking further
(as Slurm's bf_max_job_test): keeps a cycle bounded with thousands of pending jobs."""


def _gang_policy(state: State, emit: Emit) -> None:
    if state.config.stale_gang_eviction and state.stale:
        _evict_stale_gangs(state, emit)
    shares = fair_shares(state)
    reservations: list[Reservation] = []
    done: dict[str, None] = {}
    cursor: dict[str, int] = {}
    blocked: dict[str, None] = {}
    misses: dict[str, int] = {}
    failed: list[tuple[int, int, bool]] = []
    leaves = [q for q in state.leaf_queues() if q.pending]
    backfill = state.config.backfill
    running = RunningEnds(state)
    victims = Victims(state)
    # Reservations of plain gangs by shape: the same shape on the same nodes reserves the
    # same nodes at the same time, until a placement changes the nodes (then cleared).
    planned: dict[tuple[object, ...], Reservation | None] = {}
    limited = {q.name: _limited(state, q.name) for q in leaves}
    # The queues in KAI's order. Order keys change only when allocations change, so the
    # ranking is redone after each placement; in between the next queue is the first one
    # ranked that still has a job to try (queues only drop out until then).
    ranked: list[Queue] = []
    at = 0
    while True:
        if not ranked:
            jobs = state.jobs
            ranked = sorted(
                (q for q in leaves if q.pending), key=lambda q: _queue_order(q, shares, jobs)
            )
            at = 0
        while at < len(ranked) and (
            ranked[at].name in done or cursor.get(ranked[at].name, 0) >= len(ranked[at].pending)
        ):
            at += 1
        if at == len(ranked):
            return
        queue = ranked[at]
        index = cursor.get(queue.name, 0)
        job = state.jobs[queue.pending[index][2]]
        if job.backoff_until > state.now:
            _note_reason(
                job,
                f"backing off after {job.bind_failures} failed binds until "
                f"{seconds(job.backoff_until)}",
                emit,
            )
            cursor[queue.name] = index + 1
            continue
        head = queue.name not in blocked
        reason = (
            _admission_reason(state, queue, job, shares)
            if limited[queue.name] or not job.preemptible
            else None
        )
        if reason is None and _try_job(
            state, queue, job, shares, emit, reservations, failed, victims, head=head
        ):
            _note_placed(state, job, shares)
            ranked = []
            planned.clear()
            continue  # the job left pending; the same index is now the next job
        cursor[queue.name] = index + 1
        if not head:
            # Behind the queue's blocked head only plain placements into the gap are tried.
            misses[queue.name] = misses.get(queue.name, 0) + 1
            if misses[queue.name] >= BACKFILL_TRIES:
                done[queue.name] = None
            continue
        if not backfill:
            done[queue.name] = None  # first in, first out: the queue waits behind it
        else:
            blocked[queue.name] = None
        if reason is not None or not backfill:
            # Held back by a limit or quota (it reserves no nodes), or no backfill.
            _note_reason(job, reason or _capacity_reason(state, job), emit)
            continue
        shape = _reservation_shape(job, victims)
        size = _uniform_size(job) if shape is not None else None
        if size is not None and ("size", size, len(job.pods)) not in planned:
            # One walk through the running jobs serves every gang of this pod size.
            planned.update(_reserve_sizes(state, size, _uniform_gangs(state, size), running))
        key = ("size", size, len(job.pods)) if size is not None else shape
        if key is not None and key in planned:
            reservation = planned[key]
            if reservation is not None:
                reservation = Reservation(job.job, reservation.start, reservation.nodes)
                if state.now < reservation.start < NEVER:
                    _wake(state, reservation.start)
        else:
            reservation = _reserve(state, job, running, victims)
            if key is not None:
                planned[key] = reservation
        if reservation is not None:
            reservations.append(reservation)
            start = reservation.start
            if start == NEVER:
                when = "when running jobs end"
            elif start <= state.now:
                # Held by jobs past their expected runtime: a time here would be `now`, a
                # new reason (and ledger record) every cycle until they end.
                when = "as soon as overrunning jobs end"
            else:
                when = f"at {seconds(start)}"
            _note_reason(
                job,
                f"waiting for a reservation of {len(reservation.nodes)} nodes {when}; "
                f"smaller jobs backfill the gap",
                emit,
            )
        else:
            _note_reason(job, _capacity_reason(state, job), emit)


def _note_placed(state: State, job: Job, shares: Shares) -> None:
    held = held_gpu(job)
    for q in state.ancestors(job.queue):
        shares.placed[q.name] = shares.placed.get(q.name, 0) + held


def _queue_order(
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


def _limited(state: State, leaf: str) -> bool:
    """Whether the leaf or an ancestor has a limit (else ``_admission_reason`` can refuse
    only non-preemptible jobs)."""
    return any(
        limit != UNLIMITED and limit >= 0
        for q in state.ancestors(leaf)
        for limit in (q.limit.gpu_milli, q.limit.cpu_milli, q.limit.memory_mib)
    )


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
        # Only non-preemptible work counts against the quota here: preemptible jobs of
        # the same queue can be preempted to make room.
        for q in state.ancestors(queue.name):
            deserved = shares.deserved[q.name][0]
            if q.allocated_np + gpu > deserved:
                return (
                    f"non-preemptible job waits for deserved quota of '{q.name}': "
                    f"{gpus(q.allocated_np)} of {gpus(deserved)} GPUs held by "
                    f"non-preemptible jobs, job needs {gpus(gpu)}"
                )
    return None


def _score_for(state: State, queue: Queue, job: Job) -> Callable[[Node, int], tuple[int, str]]:
    strategy = job.placement or queue.placement or state.config.placement
    return spread_score if strategy == "spread" else binpack_score


def _try_job(
    state: State,
    queue: Queue,
    job: Job,
    shares: Shares,
    emit: Emit,
    reservations: list[Reservation],
    failed: list[tuple[int, int, bool]],
    victims: Victims,
    *,
    head: bool,
) -> bool:
    """Place one admitted job; a queue's head may also make room. The caller records why
    a job waits (one reason per cycle: a capacity wait, or the reservation made for it).

    ``failed`` remembers gang shapes that found no room this cycle: free capacity only
    shrinks between evictions, so a gang at least as large in every way fails too.
    """
    allowed = _blocked_nodes(state, job, reservations)
    shape = _gang_shape(job, allowed is not None)
    if shape is not None and any(
        shape[0] >= f[0] and shape[1] >= f[1] and shape[2] == f[2] for f in failed
    ):
        return False
    stmt = Statement(state.nodes, score=_score_for(state, queue, job), index=state.free_index())
    placements = stmt.place_gang(job, skip=allowed)
    evicted: list[tuple[Job, str]] = []
    moves: list[tuple[Job, list[PodPlacement]]] = []
    if placements is None and shape is not None and len(failed) < 32:
        failed.append(shape)
    if placements is None and head:
        placements, evicted = _make_room(state, queue, job, shares, stmt, allowed, victims)
        # Consolidation re-places the pods it moves: only where pods can be re-run (not live).
        if placements is None and state.config.consolidation and state.config.requeue_lost:
            placements, moves = _consolidate(state, job, stmt, allowed, victims)
            evicted = [(moved, "consolidation") for moved, _ in moves]
    if placements is None:
        return False
    stmt.undo_all()
    if evicted:
        failed.clear()  # evictions free capacity: what failed before may fit now
    for victim, rule in evicted:
        emit(_preemption(victim, state.now, job, rule))
    for moved, where in moves:
        emit(PodsAllocated(job=moved.job, queue=moved.queue, placements=tuple(where)))
    backfill_for = ""
    for r in reservations:
        if any(p.node in r.nodes for p in placements):
            backfill_for = r.job  # it runs in that reservation's gap and gives way to it
            break
    emit(
        PodsAllocated(
            job=job.job, queue=job.queue, placements=tuple(placements), backfill_for=backfill_for
        )
    )
    return True


def _gang_shape(job: Job, restricted: bool) -> tuple[int, int, bool] | None:
    """(largest pod's GPUs, gang's GPUs, restricted) for the failed-shape memo; None for
    gangs whose fit depends on more than size (selectors, tolerations, topology, CPU)."""
    if job.topology_key:
        return None
    largest = 0
    for pod in job.pods:
        if pod.node_selector or pod.tolerations or pod.cpu_milli or pod.memory_mib:
            return None
        if pod.gpu_memory_mib and not pod.gpu_milli:
            return None
        largest = max(largest, pod.gpu_milli)
    return (largest, job.request[0], restricted)


def _blocked_nodes(
    state: State, job: Job, reservations: list[Reservation]
) -> dict[str, None] | None:
    """Nodes the job must keep off so as not to delay a reservation (None: none).

    A job that ends before a reservation starts, or is preemptible (it will give way when
    the reservation starts), may use its nodes; any other job keeps off them.
    """
    if not reservations or job.preemptible:
        return None
    blocked: dict[str, None] = {}
    runtime = job.expected_runtime_ms
    for r in reservations:
        ends_in_time = runtime is not None and r.start != NEVER and state.now + runtime <= r.start
        if not ends_in_time:
            blocked.update(r.nodes)
    return blocked or None


@dataclass(slots=True)
class RunningEnds:
    """Expected ends of the running jobs, for reservations: read from the state's running
    index, which ``apply`` keeps current (jobs placed earlier in the cycle are in it, jobs
    evicted are not). Two orders: every job, and only the jobs holding GPUs — releasing a
    CPU-only pod changes nothing for a gang that asks only for GPUs, and need not be
    walked past."""

    state: State

    def ordered(self, gpus_only: bool) -> Iterator[tuple[int, int, str]]:
        """(expected end, seq, job) of the active jobs (holding GPUs, if ``gpus_only``),
        soonest first; lazy."""
        return self.state.running_index().ends(self.state, gpus_only)


def _expected_end(state: State, job: Job) -> int:
    if job.expected_runtime_ms is None:
        return NEVER
    began = job.started_at if job.started_at is not None else state.now
    return max(state.now, began + job.expected_runtime_ms - job.checkpointed_ms)


def _reservation_shape(job: Job, victims: Victims) -> tuple[object, ...] | None:
    """What ``_reserve`` depends on of a plain, unplaced gang that nothing was backfilled
    under (None for any other job: its reservation is worked out on its own)."""
    if job.placements or _gang_shape(job, False) is None or victims.under_of(job.job):
        return None
    return (
        tuple((p.gpu_milli, p.group) for p in job.pods),
        job.min_members,
        tuple(sorted(job.min_per_group.items())),
    )


def _uniform_size(job: Job) -> int | None:
    """The pod size of a plain gang (see ``_reservation_shape``) whose pods are all alike
    and all required, or None."""
    size = job.pods[0].gpu_milli
    if size <= 0 or job.min_per_group or job.min_members not in (0, len(job.pods)):
        return None
    if any(p.gpu_milli != size or p.group for p in job.pods):
        return None
    return size


def _uniform_gangs(state: State, size: int) -> dict[int, Job]:
    """A pending plain gang of ``size``-milli-GPU pods for each gang size waiting."""
    found: dict[int, Job] = {}
    jobs = state.jobs
    for leaf in state.leaf_queues():
        for _, _, job_id in leaf.pending:
            job = jobs[job_id]
            count = len(job.pods)
            if (
                count not in found
                and not job.placements
                and _gang_shape(job, False)
                and _uniform_size(job) == size
            ):
                found[count] = job
    return found


def _reserve_sizes(
    state: State, size: int, gangs: dict[int, Job], running: RunningEnds
) -> dict[tuple[object, ...], Reservation | None]:
    """``_reserve`` for gangs of ``size``-milli-GPU pods, every gang size in one walk.

    Placement is greedy pod by pod, so where a gang of n such pods fits, its first m < n
    pods land exactly where a gang of m would: a smaller gang fits at least as early and
    on those very nodes. The running jobs are released once, in the order ``_reserve``
    uses; at each release the smallest gangs not yet placed are tried while they fit,
    from the point where the same cheap bounds ``_reserve`` uses would let them be tried.
    The results are what ``_reserve`` gives each gang (with no job backfilled under it).
    """
    index = state.free_index()
    stmt = Statement(state.nodes, index=index)
    free = sum(n.free_gpu_milli for n in state.nodes.values() if not n.cordoned)
    bound = index.slots_at_most(size)
    counts = sorted(gangs)
    found: dict[tuple[object, ...], Reservation | None] = {
        ("size", size, count): None for count in counts
    }
    jobs = state.jobs
    nodes = state.nodes
    waiting = 0  # counts[waiting] is the smallest gang not placed yet
    for end, _, job_id in running.ordered(True):
        other = jobs[job_id]
        if other.status not in ACTIVE:
            continue
        before: dict[str, int] = {}
        for placement in other.live():
            node = nodes.get(placement.node)
            if node is not None:
                before.setdefault(node.name, node.free_gpu_milli)
            free += sum(slot.milli for slot in placement.gpus)
        stmt.evict(other)
        for name, was in before.items():
            bound += nodes[name].free_gpu_milli // size - was // size
        while waiting < len(counts):
            count = counts[waiting]
            if free < count * size or bound < count:
                break
            point = stmt.checkpoint()
            placed = stmt.place_gang(gangs[count])
            if placed is None:
                break
            stmt.rollback(point)
            found[("size", size, count)] = Reservation("", end, {p.node: None for p in placed})
            waiting += 1
        if waiting == len(counts):
            break
    stmt.undo_all()
    return found


def _reserve(state: State, job: Job, running: RunningEnds, victims: Victims) -> Reservation | None:
    """EASY backfill: where and when the job could start as running jobs end.

    Running jobs are released in order of expected end (those without an expected runtime
    last, as if never); the first time the gang fits on what is then free is the
    reservation's start, and the nodes it would get are held. Jobs backfilled under this
    very reservation give way when it starts, so their nodes count as free from the
    outset, or every backfill would push the reservation later.
    """
    index = state.free_index()
    stmt = Statement(state.nodes, index=index)
    reservation: Reservation | None = None
    need = job.request[0]
    free = sum(n.free_gpu_milli for n in state.nodes.values() if not n.cordoned)
    jobs = state.jobs
    given_way: dict[str, None] = {}
    for other in _backfilled_under(job, victims):
        stmt.evict(other)
        free += victims.held_gpu(other)
        given_way[other.job] = None
    sizes = {p.gpu_milli for p in job.pods}
    pod_size = next(iter(sizes)) if len(sizes) == 1 and not job.topology_key else 0
    pods = len(job.pods) if not job.min_members else job.min_members
    # Releasing a job is only booked per node until a cheap bound says the gang could fit;
    # only then are the booked jobs evicted in the statement and a placement tried.
    booked: list[Job] = []
    extra: dict[str, int] = {}
    bound = index.slots_at_most(pod_size) if pod_size > 0 else 0
    nodes = state.nodes
    gpus_only = not any(p.cpu_milli or p.memory_mib for p in job.pods)
    for end, _, job_id in running.ordered(gpus_only):
        other = jobs[job_id]
        if other.status not in ACTIVE or job_id in given_way:
            continue  # evicted earlier in this cycle, or already counted as free
        booked.append(other)
        for placement in other.live():
            milli = sum(slot.milli for slot in placement.gpus)
            free += milli
            if pod_size > 0:
                base = nodes[placement.node].free_gpu_milli
                before = extra.get(placement.node, 0)
                extra[placement.node] = before + milli
                bound += (base + before + milli) // pod_size - (base + before) // pod_size
        if free < need:
            continue  # not enough GPUs free in total yet: no placement can succeed
        if pod_size > 0 and bound < pods:
            continue  # no node arrangement can hold the gang yet
        for booked_job in booked:
            stmt.evict(booked_job)
        booked = []
        extra = {}
        if pod_size > 0:
            bound = index.slots_at_most(pod_size)
        placed = stmt.place_gang(job)
        if placed is not None:
            reservation = Reservation(job=job.job, start=end, nodes={p.node: None for p in placed})
            break
    stmt.undo_all()
    if reservation is not None and state.now < reservation.start < NEVER:
        # Due later: a cycle then. Due now (held by overrunning jobs): their ends are
        # events, so waking every cycle until then would only repeat this one.
        _wake(state, reservation.start)
    return reservation


def _note_reason(job: Job, reason: str, emit: Emit) -> None:
    """Record why a job waits, only when the reason changed (not every cycle)."""
    if reason != job.reason:
        emit(JobUnschedulable(job=job.job, queue=job.queue, reason=reason))


def _capacity_reason(state: State, job: Job) -> str:
    stmt = Statement(state.nodes, index=state.free_index())
    required, _ = split_gang(job)
    fitted = 0
    for pod in required:
        if stmt.place(job.job, pod, None) is None:
            break
        fitted += 1
    stmt.undo_all()
    shape = _shape(required)
    return (
        f"waiting for capacity: gang needs {len(required)} pods ({shape}), "
        f"free capacity fits {fitted} of them now"
    )


def _shape(pods: list[PodSpec]) -> str:
    """``4×8 GPUs`` or ``16 GPUs`` for a list of pods."""
    sizes = {p.gpu_milli for p in pods}
    if len(sizes) == 1 and len(pods) > 1:
        return f"{len(pods)}×{gpus(pods[0].gpu_milli)} GPUs"
    return f"{gpus(sum(p.gpu_milli for p in pods))} GPUs"


# --------------------------------------------------------------------------- victims


@dataclass(slots=True)
class Victims:
    """Running preemptible jobs in victim order (least lost work first), per leaf queue,
    read from the state's running index (``scheduler.core.running``).

    Within a cycle ``now`` is fixed, so a job's order key is too; jobs placed in the cycle
    are in the index but never victims in it (they are protected), and jobs evicted in it
    have left it.
    """

    state: State
    held: dict[str, int] = field(default_factory=dict)

    def streams(self, leaf: str) -> list[tuple[int | None, Iterator[VictimItem]]]:
        """The leaf's victims as sorted streams, each with the GPUs every job in it holds
        (None: they differ)."""
        return self.state.running_index().victims(self.state, leaf)

    def of(self, leaves: Iterable[str]) -> Iterator[VictimItem]:
        """The victims of these leaf queues, cheapest first across them: (key..., job,
        GPUs held)."""
        return self.state.running_index().victim_order(self.state, leaves)

    def under_of(self, job_id: str) -> list[Job]:
        """Jobs backfilled under ``job_id``'s reservation, in victim order."""
        return self.state.running_index().backfilled_under(self.state, job_id)

    def spots(self, job: Job) -> tuple[tuple[str, int], ...]:
        """(node, milli-GPUs) of each of the job's pods holding GPUs now."""
        found = self.state.running_index().spots.get(job.job)
        return gpu_spots(job) if found is None else found

    def held_gpu(self, job: Job) -> int:
        """Milli-GPUs the job holds now."""
        held = self.held.get(job.job)
        if held is None:
            held = self.held[job.job] = held_gpu(job)
        return held


def _make_room(
    state: State,
    queue: Queue,
    job: Job,
    shares: Shares,
    stmt: Statement,
    allowed: dict[str, None] | None,
    victims: Victims,
) -> tuple[list[PodPlacement] | None, list[tuple[Job, str]]]:
    """Evict the fewest, cheapest victims that let the gang start; never in vain."""
    attempts: list[tuple[str, list[Job]]] = [("backfill", _backfilled_under(job, victims))]
    demand = gang_demand(job, stmt.fractional)
    need = job.request[0]
    free_now = sum(n.free_gpu_milli for n in state.nodes.values() if not n.cordoned)

    def room(candidates: list[Job]) -> bool:
        return _fits_after(state, stmt, demand, need, free_now, candidates, victims)

    if state.config.reclaim:
        attempts.append(("reclaim", _reclaim_candidates(state, queue, job, shares, victims)))
    if state.config.preempt:
        attempts.append(("preempt", _preempt_candidates(state, queue, job, victims)))
    for rule, candidates in attempts:
        if not candidates or not room(candidates):
            continue  # even with every candidate evicted the gang could not fit
        chosen: list[Job] = []
        placements: list[PodPlacement] | None = None
        free = free_now
        wait = 0  # victims to evict before the next placement attempt (doubles on failure)
        step = 1
        for victim in candidates:
            stmt.evict(victim)
            chosen.append(victim)
            free += victims.held_gpu(victim)
            if free < need or (stmt.index is not None and not may_fit(stmt.index, demand)):
                continue  # cheap necessary conditions before a full gang placement
            if wait > 0:
                wait -= 1
                continue
            placements = stmt.place_gang(job, skip=allowed)
            if placements is not None:
                break
            # A gang that fits the counts but not yet the nodes is tried again after
            # 1, 2, 4, ... more victims: extra victims are dropped below, attempts are not.
            wait, step = step, step * 2
        if placements is None and wait > 0:
            placements = stmt.place_gang(job, skip=allowed)  # every candidate evicted
        if placements is None:
            stmt.undo_all()  # never evict for a gang that still would not fit
            continue
        kept = _needed_victims(state, chosen, placements)
        stmt.undo_all()
        return placements, [(v, rule) for v in kept]
    return None, []


def _needed_victims(state: State, chosen: list[Job], placements: list[PodPlacement]) -> list[Job]:
    """Never more victims than the placement needs.

    Called with every chosen victim evicted and the gang placed. Victims are given back
    their resources, dearest first, whenever the placement still fits beside them (on
    the very devices and nodes it uses), so those kept are each needed by it: victims with
    nothing under the gang's nodes always go back.
    """
    nodes = state.nodes
    free: dict[str, list[int]] = {}  # the gang's nodes, in placement order
    for p in placements:
        node = nodes[p.node]
        free.setdefault(p.node, [*node.free_devices, node.free_cpu, node.free_memory])
    kept: list[Job] = []
    for victim in reversed(chosen):
        specs = {p.name: p for p in victim.pods}
        under = [(p, specs[p.pod]) for p in victim.live() if p.node in free]
        _shift(free, under, -1)  # tentatively back on its nodes
        if any(_overcommitted(nodes[p.node], free[p.node]) for p, _ in under):
            _shift(free, under, 1)
            kept.append(victim)
    kept.reverse()
    return kept


def _shift(free: dict[str, list[int]], pods: list[tuple[PodPlacement, PodSpec]], sign: int) -> None:
    """Add (``sign`` 1) or take (-1) the pods' devices, CPU and memory to ``free``: per node,
    its devices' free milli-GPUs followed by free millicores and free MiB."""
    for placement, spec in pods:
        row = free[placement.node]
        for slot in placement.gpus:
            row[slot.device] += sign * slot.milli
        row[-2] += sign * spec.cpu_milli
        row[-1] += sign * spec.memory_mib


def _overcommitted(node: Node, row: list[int]) -> bool:
    """A device, or the node's CPU or memory where it has a capacity, below zero."""
    return (
        min(row[:-2], default=0) < 0
        or (node.cpu_milli > 0 and row[-2] < 0)
        or (node.memory_mib > 0 and row[-1] < 0)
    )


def _fits_after(
    state: State,
    stmt: Statement,
    demand: list[tuple[int, int]],
    need: int,
    free: int,
    candidates: list[Job],
    victims: Victims,
) -> bool:
    """Could the gang fit at all were every candidate evicted? The victims' GPUs are
    only booked per node (no statement steps), then the bounds of ``may_fit`` applied:
    a rule whose every candidate together cannot make room is not tried victim by victim.
    """
    extra: dict[str, int] = {}
    indexed = state.running_index().spots
    for victim in candidates:
        spots = indexed.get(victim.job)
        for name, milli in victims.spots(victim) if spots is None else spots:
            extra[name] = extra.get(name, 0) + milli
            free += milli
    if free < need:
        return False
    if stmt.index is None:
        return True
    nodes = state.nodes
    for size, count in demand:
        slots = stmt.index.slots_at_most(size)
        for name, milli in extra.items():
            node = nodes.get(name)
            if node is not None:
                base = node.free_gpu_milli
                slots += (base + milli) // size - base // size
        if slots < count:
            return False
    return True


def _consolidate(
    state: State,
    job: Job,
    stmt: Statement,
    allowed: dict[str, None] | None,
    victims: Victims,
) -> tuple[list[PodPlacement] | None, list[tuple[Job, list[PodPlacement]]]]:
    """Defragment: move preemptible running jobs so the gang fits, only if every moved
    job is placed again at once (elsewhere); otherwise move nothing."""
    if sum(n.free_gpu_milli for n in state.nodes.values() if not n.cordoned) < job.request[0]:
        return None, []  # not fragmentation: there is not enough free GPU in total
    candidates = [
        item[4]
        for item in victims.of(q.name for q in state.leaf_queues())
        if item[4].status in ACTIVE and not _protected(state, item[4], "preempt")
    ]
    everywhere = list(state.nodes.values())
    moved: list[Job] = []
    demand = gang_demand(job, stmt.fractional)
    for victim in candidates:
        stmt.evict(victim)
        moved.append(victim)
        if stmt.index is not None and not may_fit(stmt.index, demand):
            continue
        point = stmt.checkpoint()
        placements = stmt.place_gang(job, skip=allowed)
        if placements is None:
            continue
        moves: list[tuple[Job, list[PodPlacement]]] = []
        for other in moved:
            live = {p.pod for p in other.live()}
            pods = [p for p in other.pods if p.name in live]
            where = stmt.place_pods(other.job, pods, everywhere)
            if where is None:
                break
            moves.append((other, where))
        if len(moves) == len(moved):
            # a job that would land exactly where it is did not need to move
            changed = [(o, w) for o, w in moves if w != o.live()]
            return placements, changed
        stmt.rollback(point)
    stmt.undo_all()
    return None, []


def _preemption(victim: Job, now: int, preemptor: Job | None, rule: str) -> JobPreempted:
    """The decision evicting ``victim`` under ``rule``, with the work it loses."""
    lost, kept = lost_work(victim, now)
    return JobPreempted(
        job=victim.job,
        queue=victim.queue,
        pods=tuple(p.pod for p in victim.live()),
        preemptor=preemptor.job if preemptor is not None else "",
        preemptor_queue=preemptor.queue if preemptor is not None else "",
        rule=rule,
        lost_gpu_ms=lost,
        checkpointed_ms=kept,
    )


def _protected(state: State, victim: Job, rule: str) -> bool:
    """Min-runtime protection: a victim that started too recently keeps running; and a job
    placed in this very cycle is never a victim in it (that would only be churn)."""
    if victim.allocated_at == state.now and victim.started_at is None:
        return True
    queue = state.queues.get(victim.queue)
    if queue is None:
        return False
    floor = queue.reclaim_min_runtime_ms if rule == "reclaim" else queue.preempt_min_runtime_ms
    if floor <= 0:
        return False
    began = victim.started_at if victim.started_at is not None else state.now
    return state.now - began < floor


def _backfilled_under(job: Job, victims: Victims) -> list[Job]:
    """Jobs backfilled into this job's reservation gap: they give way to it."""
    return [v for v in victims.under_of(job.job) if v.status in ACTIVE]


def _lowest_common_children(state: State, a: str, b: str) -> tuple[Queue, Queue] | None:
    """The two queues just below the lowest common ancestor of ``a`` and ``b``."""
    chain_a = list(reversed(state.ancestors(a)))
    chain_b = list(reversed(state.ancestors(b)))
    for qa, qb in zip(chain_a, chain_b, strict=False):
        if qa.name != qb.name:
            return qa, qb
    return None


def _reclaim_candidates(
    state: State,
    queue: Queue,
    job: Job,
    shares: Shares,
    victims: Victims,
) -> list[Job]:
    """Victims in other queues that reclaim may take from, cheapest first.

    Two strategies, as KAI-Scheduler's: **fair-share reclaim** — the reclaiming queue stays
    within its fair share, and each victim queue is above its fair share and keeps a
    saturation (allocated / fair share) at least the reclaimer's after the move, so the
    queues' order is preserved; **quota reclaim** — the reclaiming queue stays within its
    deserved quota and takes only from queues above their deserved quota. Both checks hold
    at the leaves and again where the two queues' branches meet (the siblings below their
    lowest common ancestor), so a subtree is not drained below its own share.
    """
    need = job.request[0]
    by_fair_share = queue.allocated[0] + need <= shares.fair[queue.name][0]
    by_quota = queue.allocated[0] + need <= shares.deserved[queue.name][0]
    if not (by_fair_share or by_quota):
        return []
    givers: dict[str, None] = {}
    for other in state.leaf_queues():
        if other.name == queue.name or not other.active:
            continue
        # A leaf neither above its fair share nor above its quota can give nothing: the
        # leaf-level check below would refuse each of its jobs anyway.
        held = other.allocated[0] - shares.placed.get(other.name, 0)
        over_fair = by_fair_share and held > shares.fair[other.name][0]
        over_quota = by_quota and held > shares.deserved[other.name][0]
        if over_fair or over_quota:
            givers[other.name] = None
    if not givers:
        return []
    taken: dict[str, int] = {}
    allowed: list[Job] = []
    # Per giver leaf, the levels checked ((queue taken from, most it may give) at the leaf
    # and where the branches meet), solved for the amount taken once per queue.
    levels_of: dict[str, list[tuple[str, int]]] = {}
    for leaf in givers:
        pairs = [(queue, state.queues[leaf])]
        branches = _lowest_common_children(state, queue.name, leaf)
        if branches is not None and branches[0] is not queue:
            pairs.append(branches)
        levels_of[leaf] = [
            (theirs.name, _most_taken(shares, mine, theirs, need, by_fair_share, by_quota))
            for mine, theirs in pairs
        ]
    # The givers' victims in order, merged from their streams. A stream whose jobs all hold
    # more GPUs than their queue may still give is dropped: budgets only shrink, so none
    # of its jobs could be taken any more (reading on would refuse each of them).
    now = state.now
    for levels in levels_of.values():
        for name, _ in levels:
            taken[name] = 0
    heap: list[tuple[VictimItem, int, Iterator[VictimItem], list[tuple[str, int]], int]] = []
    for leaf in givers:
        levels = levels_of[leaf]
        floor = state.queues[leaf].reclaim_min_runtime_ms  # _protected, inlined below
        for same, stream in victims.streams(leaf):
            first = next(stream, None)
            if first is not None:
                heap.append((first, -1 if same is None else same, stream, levels, floor))
    heapq.heapify(heap)
    while heap:
        top = heap[0]
        item, same, stream, levels, floor = top
        victim, held = item[4], item[5]
        if victim.status in ACTIVE:
            began = victim.started_at
            if began is None:
                protected = victim.allocated_at == now or floor > 0
            else:
                protected = floor > 0 and now - began < floor
            if not protected:
                for name, most in levels:
                    if taken[name] + held > most:
                        break
                else:
                    for name, _ in levels:
                        taken[name] += held
                    allowed.append(victim)
        following = next(stream, None)
        if following is not None and same >= 0:
            for name, most in levels:
                if taken[name] + same > most:
                    following = None  # budgets only shrink: the stream has nothing more
                    break
        if following is None:
            heapq.heappop(heap)
        elif (len(heap) < 2 or following < heap[1][0]) and (
            len(heap) < 3 or following < heap[2][0]
        ):
            heap[0] = (following, same, stream, levels, floor)  # still the smallest
        else:
            heapq.heapreplace(heap, (following, same, stream, levels, floor))
    return allowed


def _most_taken(
    shares: Shares, mine: Queue, theirs: Queue, need: int, by_fair_share: bool, by_quota: bool
) -> int:
    """The most GPUs ``mine`` (gaining ``need``) may take from ``theirs`` in one cycle
    (-1: none, NEVER: no bound). Quota reclaim takes from a queue above its deserved quota;
    fair-share reclaim from a queue above its fair share, as long as its saturation after
    the move stays at least the taker's: (theirs - taken) / their fair share >= (mine +
    need) / my fair share (``tests/test_scale_paths.py`` holds the plain form of it)."""
    their_alloc = theirs.allocated[0] - shares.placed.get(theirs.name, 0)
    if by_quota and their_alloc > shares.deserved[theirs.name][0]:
        return NEVER
    their_fair = shares.fair[theirs.name][0]
    if by_fair_share and their_alloc > their_fair:
        # (their_alloc - taken) * mine_fair >= (mine + need) * their_fair, for integers
        after_mine = mine.allocated[0] + need
        mine_fair = max(shares.fair[mine.name][0], 1)
        floor = -(-(after_mine * max(their_fair, 1)) // mine_fair)
        return their_alloc - floor
    return -1


def _preempt_candidates(state: State, queue: Queue, job: Job, victims: Victims) -> list[Job]:
    """Preemptible jobs of the same queue with strictly lower priority."""
    return [
        item[4]
        for item in victims.of((queue.name,))
        if item[4].priority < job.priority
        and item[4].status in ACTIVE
        and not _protected(state, item[4], "preempt")
    ]


# --------------------------------------------------------------------------- stale gangs


def _evict_stale_gangs(state: State, emit: Emit) -> None:
    """A running gang below its minimum for longer than the grace period is evicted whole,
    so it can be placed again instead of holding GPUs it cannot use."""
    grace = state.config.stale_gang_grace_ms
    for job_id in list(state.stale):
        job = state.jobs[job_id]
        since = job.stale_since
        if since is None or job.status != RUNNING:
            continue
        if state.now - since < grace:
            _wake(state, since + grace)
            continue
        emit(_preemption(job, state.now, None, "stale-gang"))
