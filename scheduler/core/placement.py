"""Placing pods on nodes, tentatively, through a statement that can roll back.

A ``Statement`` is how an action tries things: it takes node capacity for pods and gives
back the capacity of victims, each step recorded, so a gang either places whole or the
statement rolls back to a checkpoint and leaves no trace. A statement never mutates state
for good: it rolls back entirely when its ``with`` block ends, and the action turns the
placements and victims it found into decision events that ``apply`` folds — the one way
state changes.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from events.model import MILLI, GpuSlot, PodPlacement, PodSpec
from scheduler.core.state import FreeIndex, Job, JobShape, Node


def selector_matches(node: Node, selector: dict[str, str]) -> bool:
    """All selector labels present on the node with equal values."""
    labels = node.labels
    return all(labels.get(k) == v for k, v in selector.items())


def effective_gpu_milli(pod: PodSpec, fractional: bool, node: Node | None = None) -> int:
    """What the pod takes of a device on ``node``.

    Without fractional GPUs a fraction rounds up to a whole device. A pod that asks for
    device memory instead of a fraction takes the share of one device that memory is on
    that node (so more of a small GPU than of a large one); with no node, or a node that
    does not report GPU memory, that share is unknown and counted as a whole device.
    """
    milli = pod.gpu_milli
    if not milli and pod.gpu_memory_mib:
        memory = node.gpu_memory_mib if node is not None else 0
        if memory <= 0 or pod.gpu_memory_mib > memory:
            milli = MILLI if memory <= 0 else MILLI + 1  # unknown: one device; too big: none
        else:
            milli = -(-pod.gpu_memory_mib * MILLI // memory)
    if milli and milli < MILLI and not fractional:
        return MILLI
    return milli


def fits_capacity(node: Node, pod: PodSpec, gpu_milli: int) -> bool:
    """Could this pod ever run on this node, empty? (capacity, not free space)."""
    if node.cpu_milli and pod.cpu_milli > node.cpu_milli:
        return False
    if node.memory_mib and pod.memory_mib > node.memory_mib:
        return False
    if gpu_milli >= MILLI:
        return gpu_milli // MILLI <= node.gpus
    return gpu_milli == 0 or node.gpus > 0


def choose_slots(node: Node, gpu_milli: int) -> tuple[GpuSlot, ...] | None:
    """GPU slots for a pod on this node now, or None if its GPUs are not free.

    Whole GPUs take the lowest-numbered entirely free devices. A fraction goes on the
    device it fills best (least free space that still fits), so shared devices fill up
    before fresh ones are broken into.
    """
    if gpu_milli == 0:
        return ()
    free = node.free_devices
    if gpu_milli >= MILLI:
        want = gpu_milli // MILLI
        chosen: list[GpuSlot] = []
        for index, amount in enumerate(free):
            if amount == MILLI:
                chosen.append(GpuSlot(index, MILLI))
                if len(chosen) == want:
                    return tuple(chosen)
        return None
    best = -1
    best_free = MILLI + 1
    for index, amount in enumerate(free):
        if gpu_milli <= amount < best_free:
            best, best_free = index, amount
    if best < 0:
        return None
    return (GpuSlot(best, gpu_milli),)


def pod_fits_now(node: Node, pod: PodSpec) -> bool:
    """CPU, memory, selector and cordon checks (GPUs are checked by ``choose_slots``)."""
    if node.cordoned:
        return False
    if node.cpu_milli and pod.cpu_milli > node.free_cpu:
        return False
    if node.memory_mib and pod.memory_mib > node.free_memory:
        return False
    if node.taints and not tolerates(node, pod):
        return False
    return not pod.node_selector or selector_matches(node, pod.node_selector)


def split_gang(job: Job) -> tuple[list[PodSpec], list[PodSpec]]:
    """(required, optional) unplaced pods: each sub-group's minimum first, then the rest
    in order up to ``min_members`` (all pods when 0); the others are optional."""
    if not job.placements and not job.min_per_group and job.min_members in (0, len(job.pods)):
        return list(job.pods), []  # (the common case: every pod, in order, required)
    pods = [p for p in job.pods if p.name not in job.placements]
    need_total = (job.min_members or len(job.pods)) - len(job.placements)
    required: list[PodSpec] = []
    if job.min_per_group:
        have: dict[str, int] = {}
        for placed in job.placements:
            group = next((p.group for p in job.pods if p.name == placed), "")
            have[group] = have.get(group, 0) + 1
        for pod in pods:
            want = job.min_per_group.get(pod.group, 0)
            if have.get(pod.group, 0) < want:
                have[pod.group] = have.get(pod.group, 0) + 1
                required.append(pod)
    chosen = {p.name for p in required}
    for pod in pods:
        if len(required) >= need_total:
            break
        if pod.name not in chosen:
            required.append(pod)
            chosen.add(pod.name)
    order = {p.name: i for i, p in enumerate(job.pods)}
    required.sort(key=lambda p: order[p.name])
    optional = [p for p in pods if p.name not in chosen]
    return required, optional


def gang_shape(job: Job, restricted: bool) -> tuple[int, int, bool] | None:
    """(largest pod's milli-GPUs, gang's milli-GPUs, ``restricted``) of a gang whose fit
    depends on GPU sizes alone; None for gangs whose fit depends on more (selectors,
    tolerations, topology, CPU, memory). The gang policy remembers shapes that found no
    room; ``restricted`` tells a gang kept off reserved nodes from one that is not."""
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


def uniform_size(job: Job) -> int | None:
    """The pod size of a gang whose pods are all alike and all required, or None."""
    size = job.pods[0].gpu_milli
    if size <= 0 or job.min_per_group or job.min_members not in (0, len(job.pods)):
        return None
    if any(p.gpu_milli != size or p.group for p in job.pods):
        return None
    return size


def job_shape(cache: dict[str, JobShape], job: Job, *, exact_gangs: bool = True) -> JobShape:
    """The job's ``JobShape``, from ``cache`` (``State.shape_cache``) or worked out there
    (``exact_gangs``: ``Tuning.exact_gangs``, the same for every call on one cache)."""
    hit = cache.get(job.job)
    if hit is not None and hit.job is job:
        return hit
    memo = FailedShapes.shape(job, exact_gangs=exact_gangs)
    skip = None if memo is None else (memo, job.request, job.preemptible, job.expected_runtime_ms)
    uniform = (uniform_size(job) or 0) if gang_shape(job, False) is not None else 0
    found = cache[job.job] = JobShape(job, memo, skip, uniform)
    return found


def gang_demand(job: Job, fractional: bool) -> list[tuple[int, int]]:
    """(size, required pods of at least that size) over the gang's distinct pod sizes.

    Pods that ask for device memory (their size depends on the node) are left out, so
    ``may_fit`` stays a necessary condition.
    """
    required, _ = split_gang(job)
    sizes = sorted(
        effective_gpu_milli(pod, fractional)
        for pod in required
        if pod.gpu_milli or not pod.gpu_memory_mib
    )
    sizes = [size for size in sizes if size > 0]
    return [(size, len(sizes) - bisect_left(sizes, size)) for size in sorted(set(sizes))]


def may_fit(index: FreeIndex, demand: list[tuple[int, int]]) -> bool:
    """False when the free GPUs cannot hold the gang however it is arranged: every pod
    of at least ``size`` needs ``size`` free on one node. Cheaper than a placement by
    orders of magnitude, so victims and released jobs are counted before one is tried."""
    return all(index.slots_at_most(size) >= count for size, count in demand)


def least_to_free(index: FreeIndex, demand: list[tuple[int, int]]) -> int:
    """At least how many milli-GPUs evictions must free before the gang of ``demand``
    (``gang_demand``) can fit the free GPUs of ``index``: what its pods ask beyond all
    that is free, and for each size, what its pods need beyond the nodes' free GPUs
    where they could go. ``count`` pods of ``size`` on nodes with ``f`` free each need
    ``size`` of one node's: a node holds ``f // size`` of them for nothing, one more for
    ``size - f % size``, and each further one for ``size``; the cheapest ``count`` of
    those is the least to free (device boundaries, and the capacity of nodes, only add
    to it)."""
    least = 0
    asked = 0
    above = 0
    for size, count in reversed(demand):  # (count: pods of at least ``size``)
        asked += size * (count - above)
        above = count
        short = count - index.slots_at_most(size)
        if short <= 0:
            continue
        freed = 0
        # one pod more per node, the nodes with the most over a multiple of size first
        for rest, nodes in sorted(
            ((key % size, len(index.buckets[key])) for key in index.keys if key % size),
            reverse=True,
        ):
            taken = min(nodes, short)
            freed += taken * (size - rest)
            short -= taken
            if short <= 0:
                break
        least = max(least, freed + short * size)
    return max(least, asked - index.total)


def tolerates(node: Node, pod: PodSpec) -> bool:
    """Every taint of the node is tolerated by the pod (by key, or key=value)."""
    for key, value in node.taints:
        if key not in pod.tolerations and f"{key}={value}" not in pod.tolerations:
            return False
    return True


def take(
    node: Node,
    job: str,
    pod: PodSpec,
    slots: Iterable[GpuSlot],
    index: FreeIndex | None = None,
) -> None:
    """Take a pod's resources on a node (keeping the free-capacity index current)."""
    take_slots(node, slots, pod.cpu_milli, pod.memory_mib, index)
    node.pods[pod.name] = job


def take_slots(
    node: Node, slots: Iterable[GpuSlot], cpu: int, memory: int, index: FreeIndex | None = None
) -> None:
    """Take GPU slots, CPU and memory on a node without naming a pod (``State.held``)."""
    before = node.free_gpu_milli
    devices = node.free_devices
    for slot in slots:
        if slot.device >= len(devices):
            continue  # the node was re-announced with fewer GPUs
        if devices[slot.device] == MILLI:
            node.free_whole -= 1
        devices[slot.device] -= slot.milli
        node.free_gpu_milli -= slot.milli
    node.free_cpu -= cpu
    node.free_memory -= memory
    if index is not None:
        index.move(node.name, before, node.free_gpu_milli)


def give_back(
    node: Node, pod: PodSpec, slots: Iterable[GpuSlot], index: FreeIndex | None = None
) -> None:
    """Release a pod's resources on a node (keeping the free-capacity index current)."""
    give_slots(node, slots, pod.cpu_milli, pod.memory_mib, index)
    node.pods.pop(pod.name, None)


def give_slots(
    node: Node, slots: Iterable[GpuSlot], cpu: int, memory: int, index: FreeIndex | None = None
) -> None:
    """The inverse of ``take_slots``."""
    before = node.free_gpu_milli
    devices = node.free_devices
    for slot in slots:
        if slot.device >= len(devices):
            continue  # the node was re-announced with fewer GPUs: never charged there
        devices[slot.device] += slot.milli
        node.free_gpu_milli += slot.milli
        if devices[slot.device] == MILLI:
            node.free_whole += 1
    node.free_cpu += cpu
    node.free_memory += memory
    if index is not None:
        index.move(node.name, before, node.free_gpu_milli)


NodeScore = Callable[[Node, int], tuple[int, str]]
"""Lower is better: (score, node name) so ties break by name."""


def binpack_score(node: Node, gpu_milli: int) -> tuple[int, str]:
    """Best fit: the node left with the least free GPU after placing (then by name)."""
    return (node.free_gpu_milli - gpu_milli, node.name)


def spread_score(node: Node, gpu_milli: int) -> tuple[int, str]:
    """Least allocated first, like kube-scheduler's default NodeResourcesFit scoring."""
    return (-(node.free_gpu_milli - gpu_milli), node.name)


@dataclass(slots=True)
class _Step:
    node: Node
    job: str
    pod: PodSpec
    slots: tuple[GpuSlot, ...]
    taken: bool

    def __init__(
        self, node: Node, job: str, pod: PodSpec, slots: tuple[GpuSlot, ...], taken: bool
    ) -> None:
        # (written out: compiled, a dataclass's generated ``__init__`` runs as Python)
        self.node = node
        self.job = job
        self.pod = pod
        self.slots = slots
        self.taken = taken


@dataclass(slots=True)
class Statement:
    """Tentative allocations and evictions over the nodes, with checkpoint and rollback.

    Used as a context manager: every step rolls back when the ``with`` block ends, so an
    action reads what it found (placements, victims) inside the block and emits the
    decisions after it; ``apply`` then takes the capacity for real.
    """

    nodes: dict[str, Node]
    fractional: bool
    score: NodeScore
    index: FreeIndex | None
    """The state's free-capacity index, when ``nodes`` are the state's own nodes."""
    steps: list[_Step]
    evicted: list[str]

    def __init__(
        self,
        nodes: dict[str, Node],
        fractional: bool = True,
        score: NodeScore = binpack_score,
        index: FreeIndex | None = None,
    ) -> None:
        # (written out: compiled, a dataclass's generated ``__init__`` runs as Python)
        self.nodes = nodes
        self.fractional = fractional
        self.score = score
        self.index = index
        self.steps = []
        self.evicted = []

    def checkpoint(self) -> tuple[int, int]:
        """A point to roll back to."""
        return (len(self.steps), len(self.evicted))

    def rollback(self, point: tuple[int, int] = (0, 0)) -> None:
        """Undo every step after ``point`` (everything by default)."""
        keep_steps, keep_evicted = point
        while len(self.steps) > keep_steps:
            step = self.steps.pop()
            if step.taken:
                give_back(step.node, step.pod, step.slots, self.index)
            else:
                take(step.node, step.job, step.pod, step.slots, self.index)
        del self.evicted[keep_evicted:]

    def place(
        self,
        job: str,
        pod: PodSpec,
        candidates: Iterable[Node] | None,
        skip: dict[str, None] | None = None,
    ) -> PodPlacement | None:
        """Put one pod on the best candidate node now, or return None.

        ``candidates`` None means every node: then, for the two standard scores, the
        free-capacity index is walked in score order and the first node that fits wins.
        """
        by_memory = not pod.gpu_milli and pod.gpu_memory_mib > 0
        gpu = effective_gpu_milli(pod, self.fractional)
        if candidates is None:
            if self.index is not None and not by_memory and self.score in _ORDERED:
                return self._place_indexed(job, pod, gpu, skip)
            candidates = self.nodes.values()
        if skip:
            candidates = [n for n in candidates if n.name not in skip]
        found = self._best(candidates, pod, gpu, by_memory)
        if found is None:
            return None
        best, best_gpu = found
        slots = choose_slots(best, best_gpu)
        assert slots is not None
        take(best, job, pod, slots, self.index)
        self.steps.append(_Step(best, job, pod, slots, taken=True))
        return PodPlacement(pod=pod.name, node=best.name, gpus=slots)

    def _best(
        self, candidates: Iterable[Node], pod: PodSpec, gpu: int, by_memory: bool
    ) -> tuple[Node, int] | None:
        """The best-scoring candidate the pod fits on now, with the milli-GPUs it takes
        there (``gpu``, or by memory per node)."""
        best: Node | None = None
        best_gpu = 0
        best_score: tuple[int, str] | None = None
        for node in candidates:
            if by_memory:
                gpu = effective_gpu_milli(pod, self.fractional, node)
                if gpu > MILLI:
                    continue  # the pod's memory does not fit one of this node's devices
            whole = gpu // MILLI if gpu >= MILLI else 0
            # cheap counters first: most nodes of a busy cluster fail here
            if node.free_whole < whole or node.free_gpu_milli < gpu:
                continue
            if not pod_fits_now(node, pod):
                continue
            # whole GPUs fit whenever enough devices are entirely free (checked above);
            # a fraction needs one device with room, so only fractions look at devices
            if 0 < gpu < MILLI and choose_slots(node, gpu) is None:
                continue
            score = self.score(node, gpu)
            if best_score is None or score < best_score:
                best, best_gpu, best_score = node, gpu, score
        return None if best is None else (best, best_gpu)

    def place_gang(
        self, job: Job, nodes: list[Node] | None = None, skip: dict[str, None] | None = None
    ) -> list[PodPlacement] | None:
        """Place the gang's required pods all-or-nothing, then any optional ones that fit.

        ``nodes`` limits the candidates (all nodes by default) and ``skip`` names nodes to
        keep off (a reservation's). With a topology key the pods go into one domain (nodes
        sharing that label's value): domains are tried fullest first; ``topology_required``
        fails rather than spread.
        """
        if not job.topology_key:
            return self._place_all(job, nodes, skip)
        pool = list(self.nodes.values()) if nodes is None else nodes
        if skip:
            pool = [n for n in pool if n.name not in skip]
        domains: dict[str, list[Node]] = {}
        for node in pool:
            value = node.labels.get(job.topology_key)
            if value is not None:
                domains.setdefault(value, []).append(node)
        order = sorted(domains, key=lambda d: (sum(n.free_gpu_milli for n in domains[d]), d))
        for domain in order:
            placed = self._place_all(job, domains[domain], None)
            if placed is not None:
                return placed
        return None if job.topology_required else self._place_all(job, pool, None)

    def _place_all(
        self, job: Job, nodes: list[Node] | None, skip: dict[str, None] | None
    ) -> list[PodPlacement] | None:
        point = self.checkpoint()
        required, optional = split_gang(job)
        placed: list[PodPlacement] = []
        for pod in required:
            placement = self.place(job.job, pod, nodes, skip)
            if placement is None:
                self.rollback(point)
                return None
            placed.append(placement)
        for pod in optional:
            placement = self.place(job.job, pod, nodes, skip)
            if placement is not None:
                placed.append(placement)
        return placed

    def _place_indexed(
        self, job: str, pod: PodSpec, gpu: int, skip: dict[str, None] | None
    ) -> PodPlacement | None:
        assert self.index is not None
        walk = self.index.ascending if self.score is binpack_score else self.index.descending
        whole = gpu // MILLI if gpu >= MILLI else 0
        nodes = self.nodes
        for name in walk(gpu):
            if skip and name in skip:
                continue
            node = nodes[name]
            if node.free_whole < whole or not pod_fits_now(node, pod):
                continue
            slots = choose_slots(node, gpu)
            if slots is None:
                continue
            take(node, job, pod, slots, self.index)
            self.steps.append(_Step(node, job, pod, slots, taken=True))
            return PodPlacement(pod=pod.name, node=node.name, gpus=slots)
        return None

    def place_pods(
        self, job: str, pods: list[PodSpec], nodes: list[Node] | None
    ) -> list[PodPlacement] | None:
        """Place exactly these pods, all or none (used to move a running job)."""
        point = self.checkpoint()
        placed: list[PodPlacement] = []
        for pod in pods:
            placement = self.place(job, pod, nodes)
            if placement is None:
                self.rollback(point)
                return None
            placed.append(placement)
        return placed

    def evict(self, job: Job) -> None:
        """Tentatively release every pod of a running job."""
        specs = {p.name: p for p in job.pods}
        for placement in job.live():  # finished pods gave their resources back already
            node = self.nodes.get(placement.node)
            if node is None:
                continue
            spec = specs[placement.pod]
            give_back(node, spec, placement.gpus, self.index)
            self.steps.append(_Step(node, job.job, spec, placement.gpus, taken=False))
        self.evicted.append(job.job)

    def __enter__(self) -> Statement:
        return self

    def __exit__(self, *exc: object) -> None:
        """Leave the nodes as they were before the statement, whatever happened in it."""
        self.rollback()


_ORDERED: Final = (binpack_score, spread_score)
"""Scores the free-capacity index can walk in order (ascending or descending free GPUs)."""


Vector = tuple[int, ...]


def _gang_kind(job: Job) -> tuple[tuple[object, ...], Vector]:
    """``FailedShapes``' kind and vector for a gang whose fit depends on more than its
    GPUs (CPU, memory, selectors, tolerations).

    A gang of like pods (``uniform``) fits exactly when the nodes it may use hold its
    pod count of them: each node holds a number of such pods that neither the other
    nodes nor the order of placement changes (its whole free devices, its devices'
    fractions, its cores and memory, each divided by the pod's request). So it is judged
    by (pods, GPU, CPU, memory) against gangs of like pods with the same selector and
    tolerations: one asking no less of each fails too, however it is placed. Any other
    gang is judged only against gangs exactly like it, placed the same way: its pods in
    order, and how they pick nodes (the job's placement strategy, else its queue's)."""
    first = job.pods[0]
    if all(
        p.gpu_milli == first.gpu_milli
        and p.cpu_milli == first.cpu_milli
        and p.memory_mib == first.memory_mib
        and not p.gpu_memory_mib
        and p.node_selector == first.node_selector
        and p.tolerations == first.tolerations
        for p in job.pods
    ):
        kind = ("uniform", tuple(sorted(first.node_selector.items())), first.tolerations)
        return kind, (len(job.pods), first.gpu_milli, first.cpu_milli, first.memory_mib)
    pods = tuple(
        (
            p.gpu_milli,
            p.cpu_milli,
            p.memory_mib,
            p.gpu_memory_mib,
            tuple(sorted(p.node_selector.items())),
            p.tolerations,
        )
        for p in job.pods
    )
    return ("exact", job.queue, job.placement, pods), ()


def _at_most(a: Vector, b: Vector) -> bool:
    """Whether request ``a`` asks no more than ``b`` of every resource (of as many).
    (By index: compiled, it compares in place, where ``zip`` or ``map`` would be called
    as Python objects, in the test a congested cycle makes most.)"""
    return all(a[i] <= b[i] for i in range(min(len(a), len(b))))


class FailedShapes:
    """Jobs that found no room in a cycle, remembered by what decides their fit, so a job
    that asks no less cannot be tried again in vain.

    Within a cycle free capacity only shrinks until something is evicted (then
    ``clear``). So a job fails too when one that failed before asked no more of every
    resource, with the same selector and tolerations and kept off the same nodes
    (``blocked``: a hashable token of the nodes it must avoid). Three kinds of job are
    remembered: a single pod, by its (GPU, CPU, memory) request; a plain gang asking only
    for GPUs, by (largest pod, whole gang); any other gang of required pods without a
    topology (asking for CPU or memory, with selectors): a gang of like pods by (pods,
    GPU, CPU, memory), any other only against gangs exactly like it (``_gang_kind``,
    ``Tuning.exact_gangs``). So a sweep of such gangs behind a blocked head is tried once per
    shape none smaller has failed, not once per gang, and cannot use up its queue's
    ``Tuning.backfill_tries`` before a job that fits. Any other job (topology,
    GPU memory instead of a fraction, elastic gangs) is always tried. Per kind only the
    smallest failures are kept, none covering another.

    A job's shape depends on its pods alone, so it is worked out once per pending job
    (``cache``: ``State.shape_cache``) rather than at every look-up: a congested cycle
    looks up every job behind its queue's blocked head.
    """

    __slots__ = ("cache", "exact_gangs", "failed", "ruled")

    def __init__(
        self, cache: dict[str, JobShape] | None = None, *, exact_gangs: bool = True
    ) -> None:
        self.exact_gangs = exact_gangs
        """Whether gangs whose fit depends on more than GPU sizes are remembered
        (``Tuning.exact_gangs``)."""
        self.failed: dict[object, dict[tuple[object, ...], list[Vector]]] = {}
        """blocked token -> kind -> the smallest request vectors that failed."""
        self.cache: dict[str, JobShape] = {} if cache is None else cache
        self.ruled: dict[tuple[object, tuple[object, ...], Vector], None] = {}
        """(blocked, kind, vector) found ruled out: failures only accumulate until
        ``clear``, so it stays ruled out (a backlog of like jobs is judged once)."""

    @staticmethod
    def shape(job: Job, *, exact_gangs: bool = True) -> tuple[tuple[object, ...], Vector] | None:
        """(kind, request vector) of a job this memo can judge, or None."""
        if job.topology_key:
            return None
        pods = job.pods
        if len(pods) == 1:
            pod = pods[0]
            if pod.gpu_memory_mib and not pod.gpu_milli:
                return None  # its share of a device depends on the node
            if pod.node_selector or pod.tolerations:
                kind: tuple[object, ...] = (
                    "pod",
                    tuple(sorted(pod.node_selector.items())),
                    pod.tolerations,
                )
            else:
                kind = ("pod",)
            return kind, (pod.gpu_milli, pod.cpu_milli, pod.memory_mib)
        if job.min_members not in (0, len(pods)) or job.min_per_group:
            return None  # elastic: its fit depends on which pods are required
        shape = gang_shape(job, False)
        if shape is None:
            return _gang_kind(job) if exact_gangs else None
        return ("gang",), (shape[0], shape[1])

    def shape_of(self, job: Job) -> tuple[tuple[object, ...], Vector] | None:
        """``shape(job)``, from the cache."""
        return job_shape(self.cache, job, exact_gangs=self.exact_gangs).memo

    def may_fit(self, job: Job, blocked: object = ()) -> bool:
        """False if a job asking no more already failed (the job need not be tried)."""
        by_kind = self.failed.get(blocked)
        if not by_kind:
            return True
        found = self.shape_of(job)
        if found is None:
            return True
        failed = by_kind.get(found[0])
        if not failed:
            return True
        key = (blocked, found[0], found[1])
        if key in self.ruled:
            return False
        vector = found[1]
        for seen in failed:
            if _at_most(seen, vector):
                self.ruled[key] = None
                return False
        return True

    def add(self, job: Job, blocked: object = ()) -> None:
        """Remember a job that found no room."""
        found = self.shape_of(job)
        if found is not None:
            self._add(blocked, *found)

    def absorb(self, failures: dict[object, dict[tuple[object, ...], list[Vector]]]) -> None:
        """Remember the failures another memo holds (``failed``) as well."""
        for blocked, by_kind in failures.items():
            for kind, vectors in by_kind.items():
                for vector in vectors:
                    known = self.failed.get(blocked, {}).get(kind, ())
                    if not any(_at_most(seen, vector) for seen in known):
                        self._add(blocked, kind, vector)

    def _add(self, blocked: object, kind: tuple[object, ...], vector: Vector) -> None:
        by_kind = self.failed.setdefault(blocked, {})
        kept = [seen for seen in by_kind.get(kind, ()) if not _at_most(vector, seen)]
        kept.append(vector)
        by_kind[kind] = kept

    def clear(self) -> None:
        """Forget every failure (capacity was freed)."""
        self.failed.clear()
        self.ruled.clear()
