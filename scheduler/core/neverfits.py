"""Never fits: a fresh job that can never start on the cluster as it stands is rejected
at once (``job_unschedulable`` with ``final``), with the reason, instead of waiting
forever. Each rule names what does not fit: the queue, a limit, a pod, the gang as a
whole on the empty cluster, or non-preemptible work beyond its queue's deserved quota.
"""

from __future__ import annotations

from events.model import MILLI, JobUnschedulable, PodSpec
from scheduler.core.admission import over_limit
from scheduler.core.fairshare import Shares, cycle_shares
from scheduler.core.placement import (
    Statement,
    fits_capacity,
    selector_matches,
    split_gang,
)
from scheduler.core.reasons import NEVER_FITS, UNITS, amount, gpus
from scheduler.core.session import Emit
from scheduler.core.state import (
    GANG_POLICIES,
    PENDING,
    FreeIndex,
    Job,
    Node,
    ShapeKey,
    State,
    node_from_capacity,
    required,
)


def reject_impossible(state: State, emit: Emit) -> None:
    """Reject each job that arrived since the last cycle and can never start."""
    fresh, state.fresh = state.fresh, []
    shares: Shares | None = None
    for job_id in fresh:
        job = state.jobs.get(job_id)
        if job is None or job.status != PENDING:
            continue
        reason = _queue_reason(state, job) or _cluster_reason(state, job)
        if reason is None and not job.preemptible and state.policy in GANG_POLICIES:
            if shares is None:  # (the deserved quotas: the division's memo holds them)
                shares = cycle_shares(state)
            reason = _quota_reason(job, shares)
        if reason is not None:
            emit(
                JobUnschedulable(
                    job=job.job, queue=job.queue, reason=reason, final=True, cause=NEVER_FITS
                )
            )


def _quota_reason(job: Job, shares: Shares) -> str | None:
    """Non-preemptible work runs only within deserved quota: more than that never starts."""
    deserved = shares.deserved.get(job.queue, [0, 0, 0])[0]
    if job.request[0] <= deserved:
        return None
    return (
        f"non-preemptible job needs {gpus(job.request[0])} GPUs but queue "
        f"'{job.queue}' deserves only {gpus(deserved)}; non-preemptible work "
        f"runs only within deserved quota (lower its priority class or raise "
        f"the quota)"
    )


def _cluster_reason(state: State, job: Job) -> str | None:
    """What rules the job out on the cluster as it stands: no schedulable node, a pod no
    node holds, or a gang that cannot be packed even onto the empty cluster.

    The outcome depends only on the nodes and the job's shape (``_shape_key``), so it is
    remembered per shape until the next node event: a fill of thousands of like pods
    checks the nodes once, not once per job. Only shapes whose pods all have a node are
    remembered (with whether the gang packs onto the empty cluster): the other reasons
    name the job's own pod."""
    empty, empty_index, fits = _empty_cluster(state)
    key = _shape_key(job)
    fit = fits.get(key)
    if fit is None:
        reason = _nodes_reason(state, job)
        if reason is not None:
            return reason
        with Statement(empty, index=empty_index) as stmt:
            fit = stmt.place_gang(job) is not None
        fits[key] = fit
    if fit:
        return None
    return (
        f"gang of {required(job)} pods needing {gpus(job.request[0])} GPUs cannot "
        f"be packed onto the cluster even when it is empty "
        f"({gpus(sum(n.gpus for n in empty.values()) * MILLI)} schedulable GPUs "
        f"on {len(empty)} nodes"
        + (f", in one '{job.topology_key}' domain" if job.topology_required else "")
        + ")"
    )


def _shape_key(job: Job) -> ShapeKey:
    """Everything about a fresh job that ``_cluster_reason``'s checks read, names aside:
    per pod in order, whether it is placed, its requests, group, selector and tolerations;
    the gang's minimums and topology."""
    return (
        job.topology_key,
        job.topology_required,
        job.min_members,
        tuple(sorted(job.min_per_group.items())),
        tuple(
            (
                p.name in job.placements,
                p.gpu_milli,
                p.cpu_milli,
                p.memory_mib,
                p.gpu_memory_mib,
                p.group,
                tuple(sorted(p.node_selector.items())),
                p.tolerations,
            )
            for p in job.pods
        ),
    )


def _empty_cluster(
    state: State,
) -> tuple[dict[str, Node], FreeIndex, dict[ShapeKey, bool]]:
    """The schedulable nodes with nothing on them, their free index and, per job shape
    ``_cluster_reason`` has seen, whether it packs onto them (cached until a node event;
    statements on the nodes roll back, so they stay empty)."""
    version, nodes, index, fits = state.empty_nodes
    if version != state.topology or index is None:
        nodes = {}
        for n in state.nodes.values():
            if n.cordoned:
                continue
            copy = node_from_capacity(n.name, n.gpus, n.cpu_milli, n.memory_mib, n.labels)
            copy.gpu_model = n.gpu_model
            copy.taints = n.taints
            nodes[n.name] = copy
        index = FreeIndex.of(nodes)
        fits = {}
        state.empty_nodes = (state.topology, nodes, index, fits)
    return nodes, index, fits


def _queue_reason(state: State, job: Job) -> str | None:
    """What rules the job out whatever the nodes: its queue or a limit."""
    queue = state.queues.get(job.queue)
    if queue is None:
        return f"queue '{job.queue}' does not exist"
    if queue.children:
        return f"queue '{job.queue}' has child queues; submit to one of {queue.children}"
    if state.policy in GANG_POLICIES:
        hit = over_limit(state, job.queue, job.request, in_use=False)
        if hit is not None:
            q, resource, limit = hit
            return (
                f"job needs {amount(resource, job.request[resource])} {UNITS[resource]} "
                f"but queue '{q.name}' is limited to {amount(resource, limit)}"
            )
    return None


def _nodes_reason(state: State, job: Job) -> str | None:
    """No schedulable node, or a required pod that no schedulable node holds."""
    nodes = [n for n in state.nodes.values() if not n.cordoned]
    if not nodes:
        return "the cluster has no schedulable nodes"
    required_pods, _ = split_gang(job)
    for pod in required_pods:
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
