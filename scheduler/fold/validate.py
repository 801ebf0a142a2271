"""Semantic validation of intake events: ``validate(state, event) -> reason | None``.

The fold (``scheduler.core.apply``) never raises and ignores what it cannot use, because a
ledger it already accepted must always replay. Rejection with a reason happens here, at
intake, before an event reaches the ledger: a refused event goes to the dead-letter topic
and the ledger never sees it. Pure: no I/O, reads the state, changes nothing.
"""

from __future__ import annotations

from events.model import (
    MAX_NODE_GPUS,
    MILLI,
    BindFailed,
    Event,
    EvictionFailed,
    JobCancelled,
    JobSubmitted,
    NodeCordoned,
    NodeRegistered,
    NodeRemoved,
    PodBound,
    PodEvicted,
    PodFinished,
    PodStarted,
    QueueConfigured,
    QueueRemoved,
    is_decision,
)
from scheduler.core import PRIORITY_CLASSES, Queue, State


def validate(state: State, event: Event) -> str | None:
    """Why ``event`` must not enter the ledger given ``state``, or None if it may."""
    if is_decision(event):
        return f"{type(event).__name__} is a scheduler decision; intake takes only facts"
    match event:
        case JobSubmitted():
            return _job(state, event)
        case QueueConfigured():
            return _queue(state, event)
        case QueueRemoved(queue=name):
            return None if name in state.queues else f"unknown queue {name!r}"
        case NodeRegistered():
            if not event.node:
                return "node name is empty"
            bad = _below(event, ("gpus", "cpu_milli", "memory_mib", "gpu_memory_mib"))
            if bad:
                return f"node {event.node}: negative {bad[0]} ({bad[1]})"
            if event.gpus > MAX_NODE_GPUS:
                # The core keeps per-device state: 2**40 GPUs would exhaust its memory.
                return f"node {event.node}: gpus {event.gpus} is more than {MAX_NODE_GPUS}"
            return None
        case NodeRemoved(node=node) | NodeCordoned(node=node):
            return None if node in state.nodes else f"unknown node {node!r}"
        case JobCancelled(job=job):
            return None if state.known(job) else f"unknown job {job!r}"
        case PodStarted(job=job, pod=pod) | PodFinished(job=job, pod=pod):
            return _known_pod(state, job, pod)
        case (
            PodBound(job=job, pod=pod)
            | BindFailed(job=job, pod=pod)
            | PodEvicted(job=job, pod=pod)
            | EvictionFailed(job=job, pod=pod)
        ):
            return _known_pod(state, job, pod)
    return None


def _known_pod(state: State, job: str, pod: str) -> str | None:
    found = state.jobs.get(job)
    if found is None:
        # An ended job is remembered by its id only: a late event about it is accepted (the
        # fold ignores it), whatever pod it names.
        return None if job in state.ended else f"unknown job {job!r}"
    if all(p.name != pod for p in found.pods):
        return f"job {job}: unknown pod {pod!r}"
    return None


def _job(state: State, job: JobSubmitted) -> str | None:
    if not job.job:
        return "job id is empty"
    if state.known(job.job):
        return f"duplicate job id {job.job!r}"
    # The fifo baseline has no queues; every other policy needs an existing leaf queue.
    if state.policy != "fifo":
        queue = state.queues.get(job.queue)
        if queue is None:
            return f"job {job.job}: unknown queue {job.queue!r}"
        if queue.children:
            return f"job {job.job}: queue {job.queue!r} is not a leaf queue"
    if not job.pods:
        return f"job {job.job}: no pods"
    klass = job.priority_class
    if klass not in PRIORITY_CLASSES and not (
        klass.isdigit() or (klass[1:].isdigit() and klass[0] == "-")
    ):
        return (
            f"job {job.job}: unknown priority_class {klass!r} (accepted: "
            f"{', '.join(PRIORITY_CLASSES)}, or a whole number)"
        )
    names = [p.name for p in job.pods]
    if len(set(names)) != len(names):
        return f"job {job.job}: duplicate pod names"
    if not 0 <= job.min_members <= len(job.pods):
        return (
            f"job {job.job}: min_members {job.min_members} is outside 0..{len(job.pods)} "
            "(the number of pods)"
        )
    for pod in job.pods:
        bad = _below(pod, ("gpu_milli", "cpu_milli", "memory_mib", "gpu_memory_mib"))
        if bad:
            return f"job {job.job}: pod {pod.name}: negative {bad[0]} ({bad[1]})"
        if pod.gpu_milli > MILLI and pod.gpu_milli % MILLI:
            return (
                f"job {job.job}: pod {pod.name}: gpu_milli {pod.gpu_milli} is neither a "
                "fraction of one GPU (< 1000) nor whole GPUs (a multiple of 1000)"
            )
    bad = _below(job, ("expected_runtime_ms", "checkpoint_interval_ms"))
    if bad:
        return f"job {job.job}: negative {bad[0]} ({bad[1]})"
    return None


def _below(obj: object, fields: tuple[str, ...], floor: int = 0) -> tuple[str, int] | None:
    """The first of ``fields`` of ``obj`` below ``floor`` and its value, or None (an unset
    optional field, None, never is below)."""
    for what in fields:
        value = getattr(obj, what)
        if value is not None and value < floor:
            return what, value
    return None


def _queue(state: State, q: QueueConfigured) -> str | None:
    if not q.queue:
        return "queue name is empty"
    if q.parent:
        if q.parent == q.queue:
            return f"queue {q.queue} is its own parent"
        if q.parent not in state.queues:
            return f"queue {q.queue}: unknown parent queue {q.parent!r}"
        if any(a.name == q.queue for a in state.ancestors(q.parent)):
            return f"queue {q.queue}: parent {q.parent!r} would make a cycle"
    resources = ("gpu_milli", "cpu_milli", "memory_mib")
    bad = _below(q.deserved, resources)
    if bad:
        return f"queue {q.queue}: negative deserved {bad[0]} {bad[1]}"
    bad = _below(q.limit, resources, floor=-1)
    if bad:
        return f"queue {q.queue}: limit {bad[0]} {bad[1]} (use -1 for no limit)"
    if q.deserved_gpu_percent is not None and not 0 <= q.deserved_gpu_percent <= 100:
        return f"queue {q.queue}: deserved_gpu_percent {q.deserved_gpu_percent} outside 0..100"
    if q.over_quota_weight < 0:
        return f"queue {q.queue}: negative over_quota_weight ({q.over_quota_weight})"
    return _quota_fits(state, q)


def _fixed_gpus(q: Queue | QueueConfigured) -> int | None:
    """A queue's deserved GPUs when it states a fixed amount (not a percentage, not 0)."""
    if q.deserved_gpu_percent is not None or q.deserved.gpu_milli <= 0:
        return None
    return q.deserved.gpu_milli


def _quota_fits(state: State, q: QueueConfigured) -> str | None:
    """As the queues.yaml loader: children may not deserve more than their parent.

    A parent with a fixed deserved amount must cover its children's fixed amounts, and
    siblings' (or top-level queues') percentages add up to at most 100. Checked both when
    a child is configured and when a parent is re-configured below its children.
    """
    siblings = [
        other
        for other in state.queues.values()
        if other.parent == q.parent and other.name != q.queue
    ]
    percent = sum(s.deserved_gpu_percent or 0 for s in siblings) + (q.deserved_gpu_percent or 0)
    if percent > 100:
        whose = f"children of {q.parent!r}" if q.parent else "top-level queues"
        return f"queue {q.queue}: deserved_gpu_percent of the {whose} would add up to {percent}"
    parent = state.queues.get(q.parent)
    cap = None if parent is None else _fixed_gpus(parent)
    if cap is not None:
        total = sum(s.deserved.gpu_milli for s in siblings if s.deserved_gpu_percent is None)
        if q.deserved_gpu_percent is None:
            total += q.deserved.gpu_milli
        if total > cap:
            return (
                f"queue {q.queue}: deserved.gpu_milli of the children of {q.parent!r} would "
                f"add up to {total}, more than its {cap}"
            )
    own = _fixed_gpus(q)
    old = state.queues.get(q.queue)
    if own is not None and old is not None:
        kids = [state.queues[c] for c in old.children if c in state.queues]
        total = sum(k.deserved.gpu_milli for k in kids if k.deserved_gpu_percent is None)
        if total > own:
            return f"queue {q.queue}: deserved.gpu_milli {own} is less than its children's {total}"
    return None


__all__ = ["validate"]
