"""Realistic cluster states for the core benchmarks, built straight from events.

Filling a 4,000-node cluster through scheduling cycles would take longer than the
benchmarks themselves, so ``packed`` lays the running pods out directly: each node's
devices are filled by a mix of whole-GPU, half and quarter pods, some nodes hold members
of multi-node gangs, and CPU-only pods make up the requested pod count. Every pod goes
through ``apply`` as ``JobSubmitted`` → ``PodsAllocated`` → ``PodStarted``, the same
events a live cluster records, so queue allocations, indexes and start times are exactly
what the core would hold.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from events.model import (
    MILLI,
    GpuSlot,
    JobSubmitted,
    NodeRegistered,
    PodPlacement,
    PodsAllocated,
    PodSpec,
    PodStarted,
    QueueConfigured,
)
from replay.config import policy_event
from scheduler.core import State, apply

GPUS_PER_NODE = 8
HOUR_MS = 3_600_000


def tree(leaves_share: int = 33) -> list[QueueConfigured]:
    """5 top queues x 3 departments x 2 or 3 teams: 50 queues, 32 leaves."""
    queues: list[QueueConfigured] = []
    for t in range(5):
        top = f"org{t}"
        queues.append(QueueConfigured(queue=top, deserved_gpu_percent=20, over_quota_weight=1))
        for d in range(3):
            dept = f"{top}-d{d}"
            queues.append(QueueConfigured(queue=dept, parent=top, deserved_gpu_percent=30))
            for k in range(2 if (t + d) % 2 else 3):
                if len(queues) >= 50:
                    break
                queues.append(
                    QueueConfigured(
                        queue=f"{dept}-t{k}", parent=dept, deserved_gpu_percent=leaves_share,
                        over_quota_weight=1 + k,
                    )
                )  # fmt: skip
    return queues[:50]


@dataclass(slots=True)
class _Planned:
    job: str
    queue: str
    pods: list[tuple[PodSpec, PodPlacement]]
    start: int
    runtime: int


def _device_fill(rng: random.Random, free_share: float) -> list[int]:
    """Milli-GPU pods on one device: empty, one whole, two halves or four quarters."""
    roll = rng.random()
    if roll < free_share:
        return []
    return rng.choice(([MILLI], [500, 500], [250, 250, 250, 250], [250, 250, 250, 250]))


def packed(
    nodes: int,
    pods: int,
    pending: int,
    policy: str,
    *,
    seed: int = 7,
    free_share: float = 0.04,
    gang_nodes: float = 0.1,
    queues: list[QueueConfigured] | None = None,
    idle: tuple[str, ...] = (),
) -> State:
    """A cluster of ``nodes`` x 8 GPUs holding about ``pods`` running pods (GPU pods fill the
    devices, CPU-only pods make up the rest) and ``pending`` waiting jobs of 1–8 whole-node
    pods, over the 50-queue tree (or ``queues``; leaves named in ``idle`` get no jobs)."""
    rng = random.Random(seed)
    state = State()
    apply(state, policy_event(policy), 0)
    for configured in queues if queues is not None else tree():
        apply(state, configured, 0)
    names = [f"n{i:05d}" for i in range(nodes)]
    for i, name in enumerate(names):
        labels = {"rack": f"r{i // 32}"}
        apply(state, NodeRegistered(node=name, gpus=GPUS_PER_NODE, labels=labels), 0)
    leaves = [q.name for q in state.leaf_queues() if q.name not in idle]
    # Tenants use about what they deserve (the product of the percentages down the tree),
    # as on a cluster this scheduler runs: a queue far over its share would be reclaimed.
    weights = []
    for leaf in leaves:
        share = 1.0
        for q in state.ancestors(leaf):
            share *= max(q.deserved_gpu_percent or 0, 1) / 100
        weights.append(share)
    planned: list[_Planned] = []
    seq = 0

    def job_of(pod_specs: list[tuple[PodSpec, PodPlacement]], runtime_h: float) -> None:
        nonlocal seq
        planned.append(
            _Planned(
                job=f"run-{seq}",
                queue=rng.choices(leaves, weights)[0],
                pods=pod_specs,
                start=rng.randrange(1, 10 * HOUR_MS),
                runtime=int(runtime_h * HOUR_MS),
            )
        )
        seq += 1

    # multi-node gangs of whole nodes first, then devices filled pod by pod
    gang_count = int(nodes * gang_nodes)
    cursor = 0
    while cursor < gang_count:
        size = min(rng.choice((2, 2, 4, 4, 8)), gang_count - cursor)
        members = []
        for k in range(size):
            node = names[cursor + k]
            spec = PodSpec(name=f"run-{seq}-{k}", gpu_milli=GPUS_PER_NODE * MILLI)
            slots = tuple(GpuSlot(d, MILLI) for d in range(GPUS_PER_NODE))
            members.append((spec, PodPlacement(pod=spec.name, node=node, gpus=slots)))
        job_of(members, rng.uniform(2, 48))
        cursor += size
    gpu_pods = 0
    for name in names[gang_count:]:
        for device in range(GPUS_PER_NODE):
            for milli in _device_fill(rng, free_share):
                spec = PodSpec(name=f"run-{seq}-0", gpu_milli=milli)
                placement = PodPlacement(pod=spec.name, node=name, gpus=(GpuSlot(device, milli),))
                job_of([(spec, placement)], rng.uniform(0.2, 12))
                gpu_pods += 1
    cpu_pods = max(0, pods - gpu_pods - gang_count)
    for i in range(cpu_pods):
        name = names[i % nodes]
        spec = PodSpec(name=f"run-{seq}-0", cpu_milli=500)
        job_of([(spec, PodPlacement(pod=spec.name, node=name, gpus=()))], rng.uniform(0.2, 12))
    planned.sort(key=lambda p: (p.start, p.job))
    for p in planned:
        specs = tuple(spec for spec, _ in p.pods)
        apply(
            state,
            JobSubmitted(job=p.job, queue=p.queue, pods=specs, expected_runtime_ms=p.runtime),
            p.start,
        )
        placements = tuple(placement for _, placement in p.pods)
        apply(state, PodsAllocated(job=p.job, queue=p.queue, placements=placements), p.start)
        for spec in specs:
            apply(state, PodStarted(job=p.job, pod=spec.name), p.start)
    now = 10 * HOUR_MS
    for i in range(pending):
        size = rng.choice((1, 2, 4, 8))
        apply(
            state,
            JobSubmitted(
                job=f"wait-{i}", queue=rng.choice(leaves),
                pods=tuple(PodSpec(name=f"wait-{i}-{k}", gpu_milli=8000) for k in range(size)),
                expected_runtime_ms=HOUR_MS,
            ),
            now,
        )  # fmt: skip
    return state


def running_pods(state: State) -> int:
    """Pods holding resources now."""
    return sum(len(j.live()) for j in state.jobs.values())
