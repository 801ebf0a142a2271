"""Folding one event into the state: ``apply(state, event, at)``.

Inputs (facts) and decisions alike go through here, so a replay that re-runs the cycles
rebuilds exactly the state the live scheduler had. Invalid inputs (an unknown job, a pod
that is not placed) are ignored here — validation that rejects them with a reason happens
at intake — so the fold never raises on a ledger it already accepted.

A job that ends holding nothing leaves ``state.jobs`` for ``state.ended`` (``_retire``):
only its id, how it ended and its last attempt are kept. Every event about it afterwards
is one the fold ignored for an ended job anyway (a re-submission, a late start, finish,
cancel, bind failure or preemption), so forgetting the rest changes no decision.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Callable
from typing import Any, Final

from events.model import (
    MAX_NODE_GPUS,
    MILLI,
    BindFailed,
    CycleCompleted,
    Event,
    EvictionFailed,
    GpuUtilizationSampled,
    JobCancelled,
    JobPreempted,
    JobSubmitted,
    JobTerminated,
    JobUnschedulable,
    NodeCordoned,
    NodeRegistered,
    NodeRemoved,
    PodDeleted,
    PodEvicted,
    PodFinished,
    PodPlacement,
    PodsAllocated,
    PodSpec,
    PodStarted,
    PolicyConfigured,
    QueueConfigured,
    QueueRemoved,
)
from scheduler.core.placement import give_back, give_slots, take, take_slots
from scheduler.core.state import (
    ACTIVE,
    ALLOCATED,
    CANCELLED,
    FAILED,
    PENDING,
    RUNNING,
    SUCCEEDED,
    TERMINAL,
    UNSCHEDULABLE,
    HeldPod,
    Job,
    Node,
    Queue,
    State,
    ended_code,
    node_from_capacity,
    preemptible_of,
    priority_of,
    required,
    wake,
)


def apply(state: State, event: Event, at: int) -> State:
    """Fold ``event`` (stamped ``at`` ms) into ``state``; returns the same state object."""
    if isinstance(event, GpuUtilizationSampled):
        # Monitoring data, stamped by the exporter's clock: it must not even move ``now``,
        # or importing samples could change the time stamped on later decisions.
        return state
    state.now = max(state.now, at)
    kind = type(event)
    fold = _FOLDS.get(kind)
    if fold is not None:  # (``tick``, ``pod_bound`` and the like change nothing else)
        if kind not in _QUIET or (isinstance(event, JobSubmitted) and event.job in state.jobs):
            state.changes_cache += 1
            if kind not in _NO_ROOM_MADE or isinstance(event, JobSubmitted):
                state.freed_cache += 1
        fold(state, event, at)
    return state


def _on_pod_started(state: State, event: PodStarted, at: int) -> None:
    job = state.jobs.get(event.job)
    pod = event.pod
    if job is not None and pod in job.placements and pod not in job.started:
        job.started[pod] = at
        if job.status == ALLOCATED and len(job.started) >= required(job):
            job.status = RUNNING
            _note_start_end(state, job, at)
            job.started_at = at
            _reindex(state, job)


def _note_start_end(state: State, job: Job, at: int) -> None:
    """The job's gang starts at ``at``: its expected end moves from its allocation to its
    start (``RunningIndex.add``); keep the earlier of both for the reservations
    (``State.started_end_cache``). A job without an allocation time (its end counts from
    any cycle's ``now``) counts as ending at once."""
    runtime = job.expected_runtime_ms
    if runtime is None:
        return  # its end is unknown before and after: last in every release order
    began = job.started_at if job.started_at is not None else job.allocated_at
    end = 0 if began is None else min(began, at) + runtime - job.checkpointed_ms
    state.started_end_cache = min(state.started_end_cache, end)


def _on_pod_finished(state: State, event: PodFinished, at: int) -> None:
    _pod_finished(state, event.job, event.pod, event.succeeded, at)


def _on_pods_allocated(state: State, event: PodsAllocated, at: int) -> None:
    job = state.jobs.get(event.job)
    if job is not None and job.status not in TERMINAL:
        _allocate(state, job, event.placements, at)
        job.backfill_for = event.backfill_for
        _reindex(state, job)


def _on_job_preempted(state: State, event: JobPreempted, at: int) -> None:
    if event.rule == "reclaim":
        preemptor = state.jobs.get(event.preemptor)
        if preemptor is not None:
            preemptor.reclaimed_at = at
    job = state.jobs.get(event.job)
    if job is not None and job.status in ACTIVE:
        _release(state, job)
        job.checkpointed_ms += event.checkpointed_ms
        job.preemptions += 1
        if state.config.requeue_lost:
            _requeue(state, job)
        else:
            # Live: eviction deletes the pods; they cannot be bound again, so the
            # job ends (a controller re-creating them makes a new submission).
            job.status = FAILED
            job.reason = f"preempted by {event.preemptor or 'the scheduler'}"
            _retire(state, job)


def _on_job_unschedulable(state: State, event: JobUnschedulable, at: int) -> None:
    job = state.jobs.get(event.job)
    if job is not None and job.status == PENDING:
        job.reason = event.reason
        job.cause = event.cause
        if event.start >= 0:
            job.promise, job.promised_at = event.start, at
        elif event.cause != "reservation":
            # A reservation due but held by overrunning jobs keeps its promise; any other
            # wait ends it (a later reservation is a new promise).
            job.promise = job.promised_at = -1
        if event.final:
            state.remove_pending(job)
            job.status = UNSCHEDULABLE
            _retire(state, job)


def _on_job_cancelled(state: State, event: JobCancelled, _at: int) -> None:
    job = state.jobs.get(event.job)
    if job is not None and job.status not in TERMINAL:
        if job.status == PENDING:
            state.remove_pending(job)
        _release(state, job)
        job.status = CANCELLED
        _retire(state, job)


def _on_bind_failed(state: State, event: BindFailed, at: int) -> None:
    job = state.jobs.get(event.job)
    if job is None or job.status not in ACTIVE:
        return
    pod, bound_node = event.pod, event.bound_node
    if bound_node:
        # The pod is bound already and can never be bound again: the allocation is
        # not retried; the job ends, its other pods evicted (``JobTerminated``).
        if pod in job.placements:
            _lose_pod(state, job, pod, f"pod {pod} is bound to node {bound_node} already")
            if job.job in state.jobs and job.status in ACTIVE:
                state.broken.setdefault(job.job, f"pod {pod} is bound to {bound_node}")
        return
    # All-or-nothing: a gang with a pod that failed to bind goes back whole, and
    # backs off so a bind that keeps failing does not win the same GPUs every cycle.
    _release(state, job)
    _requeue(state, job)
    job.bind_failures += 1
    base = state.config.bind_backoff_ms
    if base > 0:
        delay = min(base << min(job.bind_failures - 1, 30), state.config.bind_backoff_max_ms)
        job.backoff_until = at + delay
        wake(state, job.backoff_until)


def _on_node_registered(state: State, event: NodeRegistered, _at: int) -> None:
    if event.gpus > MAX_NODE_GPUS:
        return  # more devices than that would exhaust memory; intake refuses such a node
    state.free_index_cache = None  # rebuilt on next use with the new node set
    _node_registered(state, event)
    state.topology += 1


def _on_pod_deleted(state: State, event: PodDeleted, _at: int) -> None:
    _pod_deleted(state, event.job, event.pod, event.reason or "deleted")


def _on_job_terminated(state: State, event: JobTerminated, _at: int) -> None:
    _terminate(state, event.job, event.reason)


def _on_pod_evicted(state: State, event: PodEvicted, _at: int) -> None:
    _unhold(state, event.job, event.pod)


def _on_eviction_failed(state: State, event: EvictionFailed, _at: int) -> None:
    _hold_unevicted(state, event)


def _on_node_removed(state: State, event: NodeRemoved, at: int) -> None:
    if event.node in state.nodes:
        state.node_lost = (at, event.node)
    _node_removed(state, event.node)
    state.free_index_cache = None
    state.topology += 1


def _on_node_cordoned(state: State, event: NodeCordoned, at: int) -> None:
    node = state.nodes.get(event.node)
    if node is not None:
        if event.cordoned and not node.cordoned:
            state.node_lost = (at, event.node)
        node.cordoned = event.cordoned
        state.dirty = True
        state.topology += 1


def _on_queue_configured(state: State, event: QueueConfigured, _at: int) -> None:
    _queue_configured(state, event)
    state.running_cache = None  # which queues are leaves may have changed
    state.wanted_cache = None
    state.blocks_cache.clear()
    state.uniform_cache = None
    state.share_cache = None


def _on_queue_removed(state: State, event: QueueRemoved, _at: int) -> None:
    _queue_removed(state, event.queue)
    state.running_cache = None
    state.wanted_cache = None
    state.blocks_cache.clear()
    state.uniform_cache = None
    state.share_cache = None


def _on_policy_configured(state: State, event: PolicyConfigured, _at: int) -> None:
    state.policy = event.policy
    state.config = event
    state.dirty = True


def _on_cycle_completed(state: State, _event: CycleCompleted, at: int) -> None:
    # The cycle this record closes took the fresh jobs in and left nothing to do.
    # ``cycle`` relies on this as much as a fold that applies recorded decisions
    # instead of re-running cycles (``state --at``, the projector's share fold),
    # which would otherwise hold every job id ever submitted in ``fresh``.
    state.fresh.clear()
    if state.dirty:
        state.policy_ran_at = at
    state.dirty = False


def _job_submitted(state: State, event: JobSubmitted, at: int) -> None:
    if event.job in state.jobs or event.job in state.ended:
        return  # idempotent by job id: a re-delivered submission changes nothing
    if len({p.name for p in event.pods}) != len(event.pods):
        # Pods are keyed by name, so such a gang could never be placed whole: the cycle
        # would place it again and again, forever. Intake refuses it ("duplicate pod
        # names", scheduler/fold/validate.py); the fold ignores one that gets this far.
        return
    priority = priority_of(event.priority_class)
    preemptible = preemptible_of(event.priority_class, event.preemptible)
    state.seq += 1
    job = Job(
        job=event.job,
        queue=event.queue,
        pods=event.pods,
        min_members=min(event.min_members, len(event.pods)),
        priority=priority,
        priority_class=event.priority_class,
        preemptible=preemptible,
        submitted_at=at,
        seq=state.seq,
        expected_runtime_ms=event.expected_runtime_ms,
        checkpoint_interval_ms=event.checkpoint_interval_ms,
        min_per_group=dict(event.min_per_group),
        topology_key=event.topology_key,
        topology_required=event.topology_required,
        placement=event.placement,
    )
    state.jobs[job.job] = job
    state.add_pending(job)
    state.fresh.append(job.job)
    state.dirty = True


def _allocate(state: State, job: Job, placements: tuple[PodPlacement, ...], at: int) -> None:
    specs = {p.name: p for p in job.pods}
    chain = state.ancestors(job.queue)
    for placement in placements:
        spec = specs.get(placement.pod)
        node = state.nodes.get(placement.node)
        if spec is None or node is None or placement.pod in job.placements:
            continue
        take(node, job.job, spec, placement.gpus, state.free_index_cache)
        job.placements[placement.pod] = placement
        if chain:
            chain[0].active[job.job] = None
        gpu = sum(slot.milli for slot in placement.gpus)
        for queue in chain:
            _add(queue, gpu, spec.cpu_milli, spec.memory_mib)
            if not job.preemptible:
                queue.allocated_np += gpu
    # Without gangs (fifo) a job counts as allocated only once every pod is placed.
    needed = len(job.pods) if state.policy == "fifo" else required(job)
    if job.status == PENDING and len(job.placements) >= needed:
        state.remove_pending(job)
        job.status = ALLOCATED
        job.allocated_at = at
        job.reason = job.cause = ""
        job.promise = job.promised_at = -1


def _add(queue: Queue, gpu: int, cpu: int, memory: int) -> None:
    alloc = queue.allocated
    alloc[0] += gpu
    alloc[1] += cpu
    alloc[2] += memory


def _release(state: State, job: Job, *, hold: bool = False) -> None:
    """Give back every placed pod of the job (not yet finished ones).

    ``hold``: the pods still run until the cluster reports them gone, so their node keeps
    their resources (``State.held``); only the queues' accounting lets go of them.
    """
    if not job.placements:
        return
    specs = {p.name: p for p in job.pods}
    chain = state.ancestors(job.queue)
    for placement in job.placements.values():
        if placement.pod in job.finished:
            continue
        spec = specs[placement.pod]
        node = state.nodes.get(placement.node) if hold else None
        if node is not None and node.pods.get(spec.name) == job.job:
            del node.pods[spec.name]  # its resources stay taken, now by the held pod
            state.held.setdefault(job.job, {})[spec.name] = HeldPod(
                placement.node, placement.gpus, spec.cpu_milli, spec.memory_mib
            )
            _uncount(job, spec, placement, chain)
        else:
            _release_pod(state, job, spec, placement, chain)
    job.placements = {}
    if chain:
        chain[0].active.pop(job.job, None)
    job.started = {}
    job.finished = {}
    job.started_at = None
    job.allocated_at = None
    job.backfill_for = ""
    job.stale_since = None
    state.stale.pop(job.job, None)
    state.dirty = True
    _reindex(state, job)


def _reindex(state: State, job: Job) -> None:
    """The job's placements, start or backfill mark changed: keep the running index
    (a derived cache, when built) current."""
    index = state.running_cache
    if index is not None:
        index.update(state, job)


def _release_pod(
    state: State, job: Job, spec: PodSpec, placement: PodPlacement, chain: list[Queue]
) -> None:
    """Give the pod's resources back to its node and take them off the queues' counts."""
    node = state.nodes.get(placement.node)
    if node is not None and node.pods.get(spec.name) == job.job:
        give_back(node, spec, placement.gpus, state.free_index_cache)
    _uncount(job, spec, placement, chain)


def _uncount(job: Job, spec: PodSpec, placement: PodPlacement, chain: list[Queue]) -> None:
    """Take the pod's resources off the counts of its queue and every ancestor."""
    gpu = sum(slot.milli for slot in placement.gpus)
    for queue in chain:
        _add(queue, -gpu, -spec.cpu_milli, -spec.memory_mib)
        if not job.preemptible:
            queue.allocated_np -= gpu


def _requeue(state: State, job: Job) -> None:
    job.status = PENDING
    job.attempt += 1
    job.reclaimed_at = None
    state.add_pending(job)
    state.dirty = True


def _pod_finished(state: State, job_id: str, pod: str, ok: bool, at: int) -> None:
    job = state.jobs.get(job_id)
    if job is None or pod not in job.placements or pod in job.finished:
        return
    specs = {p.name: p for p in job.pods}
    _release_pod(state, job, specs[pod], job.placements[pod], state.ancestors(job.queue))
    job.finished[pod] = ok
    state.dirty = True
    live = len(job.placements) - len(job.finished)
    if job.status == RUNNING and 0 < live < required(job) and job.stale_since is None:
        # A member ended while the rest still run: the gang can no longer make progress.
        job.stale_since = at
        state.stale[job.job] = None
        if state.config.stale_gang_eviction:
            wake(state, at + state.config.stale_gang_grace_ms)
    if len(job.finished) == len(job.placements):
        job.stale_since = None
        state.stale.pop(job.job, None)
        job.status = SUCCEEDED if all(job.finished.values()) else FAILED
        queue = state.queues.get(job.queue)
        if queue is not None:
            queue.active.pop(job.job, None)
        _reindex(state, job)
        _retire(state, job)
        return
    _reindex(state, job)  # it holds fewer GPUs now


def _retire(state: State, job: Job) -> None:
    """Forget an ended job, keeping its id with how it ended and its last attempt.

    Only once nothing refers to it: no pod of it still placed (a fifo gang marked
    unschedulable under another policy keeps its half placement), no entry in the stale
    list or its queue's active jobs, and no key in a pending order (under fifo a
    half-placed gang whose placed pods all finished ends while still pending, and fifo
    keeps offering it pods). Such a job stays whole in ``jobs`` until nothing refers to it.
    """
    if len(job.finished) != len(job.placements) or job.job in state.stale:
        return
    queue = state.queues.get(job.queue)
    if (queue is not None and job.job in queue.active) or state.in_pending(job):
        return
    del state.jobs[job.job]
    state.ended[job.job] = ended_code(job.status, job.attempt)


def retire_ended(state: State) -> int:
    """Forget every ended job that holds nothing (a state folded by an older core, which
    kept them all); returns how many were forgotten."""
    before = len(state.ended)
    for job in [job for job in state.jobs.values() if job.status in TERMINAL]:
        _retire(state, job)
    return len(state.ended) - before


def _node_registered(state: State, event: NodeRegistered) -> None:
    old = state.nodes.get(event.node)
    node = node_from_capacity(
        event.node, event.gpus, event.cpu_milli, event.memory_mib, event.labels
    )
    node.gpu_model = event.gpu_model
    node.gpu_memory_mib = event.gpu_memory_mib
    node.taints = tuple(_taint(t) for t in event.taints)
    state.nodes[event.node] = node
    if old is not None:
        node.cordoned = old.cordoned
        # Re-announcing a node keeps its pods: charge them against the new capacity.
        for pod_name, job_id in old.pods.items():
            job = state.jobs.get(job_id)
            if job is None or pod_name not in job.placements:
                continue
            spec = next(p for p in job.pods if p.name == pod_name)
            slots = tuple(s for s in job.placements[pod_name].gpus if s.device < node.gpus)
            take(node, job_id, spec, slots)
        for pods in state.held.values():
            for held in pods.values():
                if held.node == event.node:
                    take_slots(node, held.gpus, held.cpu_milli, held.memory_mib)
    state.dirty = True


def _taint(text: str) -> tuple[str, str]:
    """``key=value:Effect`` -> (key, value); the effect does not matter for placement."""
    spec = text.split(":", 1)[0]
    key, _, value = spec.partition("=")
    return (key, value)


def _node_removed(state: State, name: str) -> None:
    node = state.nodes.get(name)
    if node is None:
        return
    # The jobs with pods on a vanished node lose them; a gang cannot run short, so the
    # whole job goes back to pending (its lost work is not a preemption by the policy).
    # Held pods vanish with their node.
    _drop_held_on(state, name)
    if state.config.requeue_lost:
        _requeue_from(state, node)
    else:
        _lose_pods_on(state, node)
    del state.nodes[name]
    state.dirty = True


def _drop_held_on(state: State, name: str) -> None:
    """Forget the held pods on node ``name``."""
    for job_id in [
        j for j, pods in state.held.items() if any(h.node == name for h in pods.values())
    ]:
        pods = state.held[job_id]
        for pod in [p for p, h in pods.items() if h.node == name]:
            del pods[pod]
        if not pods:
            del state.held[job_id]


def _lose_pods_on(state: State, node: Node) -> None:
    """Live: the pods on the node are lost; the jobs keep what they hold elsewhere and a
    gang left below its minimum is ended by the next cycle (``JobTerminated``)."""
    for pod_name, job_id in list(node.pods.items()):
        job = state.jobs.get(job_id)
        if job is None:
            continue
        if job.status in ACTIVE:
            _lose_pod(state, job, pod_name, f"node {node.name} was removed")
        elif job.status == PENDING:
            _release(state, job)


def _requeue_from(state: State, node: Node) -> None:
    """Simulated (``requeue_lost``): every job with a pod on the node goes back whole."""
    for job_id in list(dict.fromkeys(node.pods.values())):
        job = state.jobs.get(job_id)
        if job is None:
            continue
        if job.status in ACTIVE:
            _release(state, job)
            _requeue(state, job)
        elif job.status == PENDING:
            _release(state, job)  # a half-placed pod under fifo simply waits again


def _lose_pod(state: State, job: Job, pod: str, why: str) -> None:
    """A placed pod of an active job is gone from the cluster: free what it held.

    The job keeps its other pods. Left below its minimum (with none, too) it is broken: the
    next cycle ends it and evicts what is left of it (``JobTerminated``).
    """
    placement = job.placements.get(pod)
    if placement is None or pod in job.finished:
        return
    spec = next(p for p in job.pods if p.name == pod)
    _release_pod(state, job, spec, placement, state.ancestors(job.queue))
    job.finished[pod] = False
    state.dirty = True
    live = len(job.placements) - len(job.finished)
    needed = required(job)
    if live < needed:
        gang = f"gang below its minimum ({live} of {needed}): " if needed > 1 else ""
        state.broken.setdefault(job.job, gang + why)
    _reindex(state, job)


def _pod_deleted(state: State, job_id: str, pod: str, reason: str) -> None:
    _unhold(state, job_id, pod)
    job = state.jobs.get(job_id)
    if job is None:
        return
    if job.status == PENDING:
        # A pending job whose pod is gone cannot run as submitted.
        state.remove_pending(job)
        _release(state, job)
        job.status = CANCELLED
        job.reason = f"pod {pod} {reason}"
        _retire(state, job)
    elif job.status in ACTIVE:
        _lose_pod(state, job, pod, f"pod {pod} {reason}")


def _terminate(state: State, job_id: str, reason: str) -> None:
    """``JobTerminated``: the job ends; its pods still on a node are held until gone."""
    state.broken.pop(job_id, None)
    job = state.jobs.get(job_id)
    if job is None or job.status not in ACTIVE:
        return
    _release(state, job, hold=True)
    job.status = FAILED
    job.reason = reason
    queue = state.queues.get(job.queue)
    if queue is not None:
        queue.active.pop(job.job, None)
    _retire(state, job)


def _unhold(state: State, job_id: str, pod: str) -> None:
    """A held pod is gone: its node's resources are free."""
    pods = state.held.get(job_id)
    held = None if pods is None else pods.pop(pod, None)
    if held is None:
        return
    if not pods:
        del state.held[job_id]
    node = state.nodes.get(held.node)
    if node is not None:
        give_slots(node, held.gpus, held.cpu_milli, held.memory_mib, state.free_index_cache)
    state.dirty = True


def _hold_unevicted(state: State, event: EvictionFailed) -> None:
    """A preempted pod still runs: its node's slots are held again until it is gone.

    A job the ledger placed on those slots meanwhile gives way and waits again (the cluster
    is the truth for what runs).
    """
    node = state.nodes.get(event.node)
    job = state.jobs.get(event.job)
    if node is None or event.pod in state.held.get(event.job, {}):
        return
    if job is not None and event.pod in job.placements and event.pod not in job.finished:
        return  # the ledger schedules this pod again: not a leftover
    if not (event.gpus or event.cpu_milli or event.memory_mib):
        return  # it holds nothing the ledger accounts for
    devices = {s.device: s.milli for s in event.gpus if s.device < node.gpus}
    short = {d for d, milli in devices.items() if node.free_devices[d] < milli}
    if short:
        for job_id in list(dict.fromkeys(node.pods.values())):
            other = state.jobs.get(job_id)
            if other is None or other.status not in ACTIVE:
                continue
            if any(
                s.device in short
                for p in other.placements.values()
                if p.node == node.name
                for s in p.gpus
            ):
                _release(state, other)
                _requeue(state, other)
    slots = tuple(s for s in event.gpus if s.device < node.gpus)
    take_slots(node, slots, event.cpu_milli, event.memory_mib, state.free_index_cache)
    state.held.setdefault(event.job, {})[event.pod] = HeldPod(
        node.name, slots, event.cpu_milli, event.memory_mib
    )
    state.dirty = True


def _queue_configured(state: State, event: QueueConfigured) -> None:
    old = state.queues.get(event.queue)
    queue = Queue(
        name=event.queue,
        parent=event.parent,
        deserved=event.deserved,
        deserved_gpu_percent=event.deserved_gpu_percent,
        over_quota_weight=event.over_quota_weight,
        limit=event.limit,
        priority=event.priority,
        preempt_min_runtime_ms=event.preempt_min_runtime_ms,
        reclaim_min_runtime_ms=event.reclaim_min_runtime_ms,
        placement=event.placement,
    )
    if old is not None:
        _carry_over(state, old, queue)
    state.queues[event.queue] = queue
    if event.parent in state.queues:
        siblings = state.queues[event.parent].children
        if event.queue not in siblings:
            siblings.append(event.queue)
            siblings.sort()
    # Children configured before their parent attach now.
    for other in state.queues.values():
        if other.parent == event.queue and other.name not in queue.children:
            queue.children.append(other.name)
    queue.children.sort()
    if old is None:
        # Jobs submitted before their queue existed join its pending order now.
        for job in state.jobs.values():
            if job.queue == event.queue and job.status == PENDING:
                insort(queue.pending, job.pending_key)
    state.dirty = True


def _carry_over(state: State, old: Queue, queue: Queue) -> None:
    """A queue configured again keeps what it runs and waits for (a quota edit does not
    forget it), and leaves its old parent if it moved."""
    queue.children = old.children
    queue.allocated = old.allocated
    queue.allocated_np = old.allocated_np
    queue.pending = old.pending
    queue.active = old.active
    if old.parent != queue.parent and old.parent in state.queues:
        siblings = state.queues[old.parent].children
        if queue.name in siblings:
            siblings.remove(queue.name)


def _queue_removed(state: State, name: str) -> None:
    queue = state.queues.pop(name, None)
    if queue is None:
        return
    # Its pending jobs are re-checked by the next cycle, which rejects them with a reason.
    state.fresh.extend(job_id for _, _, job_id in queue.pending)
    if queue.parent in state.queues:
        siblings = state.queues[queue.parent].children
        if name in siblings:
            siblings.remove(name)
    state.dirty = True


def lost_work(job: Job, now: int, gpu_milli: int | None = None) -> tuple[int, int]:
    """(lost GPU-ms, checkpointed ms) if the job were evicted at ``now``.

    Work since the last checkpoint is lost; GPU-weighted by the gang's GPUs (the milli-GPUs
    it holds, ``gpu_milli`` when the caller has them already). A job that is not yet
    running has lost nothing.
    """
    if job.started_at is None or now <= job.started_at:
        return (0, 0)
    ran = now - job.started_at
    interval = job.checkpoint_interval_ms
    kept = (ran // interval) * interval if interval else 0
    if gpu_milli is None:
        gpu_milli = sum(slot.milli for p in job.live() for slot in p.gpus)
    return ((ran - kept) * gpu_milli // MILLI, kept)


_QUIET: Final[frozenset[type[Event]]] = frozenset(
    {JobSubmitted, JobUnschedulable, CycleCompleted, PodStarted}
)
"""Folded events that change nothing a reservation is worked out from
(``State.changes_cache``): a new job's submission only adds to a pending order; a reason
and a cycle's end only mark jobs and the state. A submission for a job the state holds
already is not quiet. A pod's start moves its job's expected end only when its gang
starts, and that is kept apart (``State.started_end_cache``). Events without a fold change
nothing but ``now``."""

_NO_ROOM_MADE: Final[frozenset[type[Event]]] = _QUIET | {PodsAllocated, PodStarted}
"""Folded events that give no capacity back and change no node (``State.freed_cache``):
besides the quiet ones, a placement only takes capacity and a pod's start only marks it.
So a placement that failed before them fails after them too."""

_FOLDS: Final[dict[type[Event], Callable[[State, Any, int], None]]] = {
    JobSubmitted: _job_submitted,
    PodStarted: _on_pod_started,
    PodFinished: _on_pod_finished,
    PodsAllocated: _on_pods_allocated,
    JobPreempted: _on_job_preempted,
    JobUnschedulable: _on_job_unschedulable,
    JobCancelled: _on_job_cancelled,
    BindFailed: _on_bind_failed,
    NodeRegistered: _on_node_registered,
    PodDeleted: _on_pod_deleted,
    JobTerminated: _on_job_terminated,
    PodEvicted: _on_pod_evicted,
    EvictionFailed: _on_eviction_failed,
    NodeRemoved: _on_node_removed,
    NodeCordoned: _on_node_cordoned,
    QueueConfigured: _on_queue_configured,
    QueueRemoved: _on_queue_removed,
    PolicyConfigured: _on_policy_configured,
    CycleCompleted: _on_cycle_completed,
}
"""How each kind of event folds into the state; kinds not here (``tick``, ``pod_bound``,
``job_rejected``) change nothing but ``now``."""
