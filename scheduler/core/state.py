"""The scheduler's state: what folding the ledger's events produces.

Plain mutable classes with slots: the core folds hundreds of thousands of events per
second, so it mutates in place rather than copying. Determinism comes from discipline, not
immutability: containers are dicts (iterated in insertion order, which follows the ledger)
or sorted lists, never sets of strings; every sort has a complete tie-breaker.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

from events.model import MILLI, GpuSlot, PodPlacement, PodSpec, PolicyConfigured, Resources
from scheduler.core.pendingblocks import PendingBlocks
from scheduler.core.running import NEVER, RunningIndex
from scheduler.core.tuning import DEFAULT, Tuning

PRIORITY_CLASSES: Final[dict[str, int]] = {
    "train": 50,
    "build-preemptible": 75,
    "build": 100,
    "inference": 125,
}
"""KAI-Scheduler's priority class names and values."""

NON_PREEMPTIBLE_FROM: Final = 100
"""Jobs of priority classes at or above this are non-preemptible unless overridden."""

UNLIMITED: Final = -1

# Job statuses. A preempted job returns to PENDING.
PENDING: Final = "pending"
ALLOCATED: Final = "allocated"
RUNNING: Final = "running"
SUCCEEDED: Final = "succeeded"
FAILED: Final = "failed"
CANCELLED: Final = "cancelled"
UNSCHEDULABLE: Final = "unschedulable"
ACTIVE: Final = (ALLOCATED, RUNNING)
TERMINAL: Final = (SUCCEEDED, FAILED, CANCELLED, UNSCHEDULABLE)
"""How a job can end; an ended job's code (``ended_code``) holds the index of its status."""


def ended_code(status: str, attempt: int) -> int:
    """What ``State.ended`` keeps of an ended job: how it ended and its last attempt.

    One int, ``attempt * 4 + TERMINAL.index(status)``: below 257 (an attempt below 64) it is
    one of CPython's shared small ints, so the entry costs only its key and its dict slot,
    and it encodes in one or two msgpack bytes.
    """
    return attempt << 2 | TERMINAL.index(status)


def ended_status(code: int) -> str:
    """The terminal status an ``ended_code`` holds."""
    return TERMINAL[code & 3]


def ended_attempt(code: int) -> int:
    """The last attempt an ``ended_code`` holds."""
    return code >> 2


def preemptible_of(priority_class: str, preemptible: bool | None) -> bool:
    """Whether a job may be preempted: as it says, else by its priority class (below
    ``NON_PREEMPTIBLE_FROM``)."""
    if preemptible is not None:
        return preemptible
    return priority_of(priority_class) < NON_PREEMPTIBLE_FROM


def priority_of(priority_class: str) -> int:
    """Numeric priority of a class name; an integer string is taken as the value itself."""
    if priority_class in PRIORITY_CLASSES:
        return PRIORITY_CLASSES[priority_class]
    try:
        return int(priority_class)
    except ValueError:
        return PRIORITY_CLASSES["train"]


ShapeKey = tuple[object, ...]
"""A job's shape as ``neverfits`` judges it: its pods' requests, selectors, tolerations and
groups and the gang's minimums and topology, names aside."""


@dataclass(slots=True)
class Node:
    """A node's capacity and what is free on it now."""

    name: str
    gpus: int
    cpu_milli: int
    memory_mib: int
    labels: dict[str, str]
    gpu_model: str = ""
    gpu_memory_mib: int = 0
    taints: tuple[tuple[str, str], ...] = ()
    """(key, value) of each taint a pod must tolerate."""
    cordoned: bool = False
    free_devices: list[int] = field(default_factory=list)
    free_cpu: int = 0
    free_memory: int = 0
    pods: dict[str, str] = field(default_factory=dict)
    """pod name -> job id, in placement order."""
    free_gpu_milli: int = 0
    """Free milli-GPUs summed over devices (kept in step with free_devices)."""
    free_whole: int = 0
    """How many devices are entirely free (kept in step with free_devices)."""


@dataclass(slots=True)
class HeldPod:
    """A pod outside scheduling that still holds resources on a node (see ``State.held``)."""

    node: str
    gpus: tuple[GpuSlot, ...]
    cpu_milli: int
    memory_mib: int


@dataclass(slots=True)
class Queue:
    """A node of the queue tree (a leaf takes jobs; an inner queue divides its share)."""

    name: str
    parent: str
    deserved: Resources
    deserved_gpu_percent: int | None
    over_quota_weight: int
    limit: Resources
    priority: int
    preempt_min_runtime_ms: int = 0
    reclaim_min_runtime_ms: int = 0
    placement: str = ""
    children: list[str] = field(default_factory=list)
    """Sorted child names."""
    allocated: list[int] = field(default_factory=lambda: [0, 0, 0])
    """[gpu_milli, cpu_milli, memory_mib] allocated to this queue's subtree."""
    allocated_np: int = 0
    """GPU milli of non-preemptible jobs in this subtree (they must stay within quota)."""
    pending: list[tuple[int, int, str]] = field(default_factory=list)
    """Pending jobs of this (leaf) queue as sorted (-priority, seq, job id)."""
    active: dict[str, None] = field(default_factory=dict)
    """Jobs of this (leaf) queue holding resources, in allocation order."""


@dataclass(slots=True)
class Job:
    """A gang and its lifecycle."""

    job: str
    queue: str
    pods: tuple[PodSpec, ...]
    min_members: int
    priority: int
    priority_class: str
    preemptible: bool
    submitted_at: int
    seq: int
    expected_runtime_ms: int | None = None
    checkpoint_interval_ms: int | None = None
    status: str = PENDING
    placements: dict[str, PodPlacement] = field(default_factory=dict)
    started: dict[str, int] = field(default_factory=dict)
    """pod -> start time, in the current attempt."""
    finished: dict[str, bool] = field(default_factory=dict)
    """pod -> succeeded, in the current attempt."""
    started_at: int | None = None
    """When the gang began running in the current attempt."""
    attempt: int = 0
    checkpointed_ms: int = 0
    """Progress kept from earlier attempts (by checkpoints)."""
    preemptions: int = 0
    reason: str = ""
    """The last non-final unschedulable reason recorded."""
    cause: str = ""
    """The kind of that reason (``job_unschedulable.cause``)."""
    promise: int = -1
    """When the job's reservation was last promised to start (``job_unschedulable.start``;
    -1: no promise stands). A later cycle moving it later says why (``reasons``)."""
    promised_at: int = -1
    """When that promise was recorded."""
    min_per_group: dict[str, int] = field(default_factory=dict)
    topology_key: str = ""
    topology_required: bool = False
    placement: str = ""
    allocated_at: int | None = None
    """When the current attempt's gang was allocated."""
    reclaimed_at: int | None = None
    """When the current attempt started by reclaiming from other queues (None: it did not)."""
    bind_failures: int = 0
    backoff_until: int = 0
    """No placement before this time (after failed binds)."""
    backfill_for: str = ""
    """The job whose reservation this one was backfilled under (current attempt)."""
    stale_since: int | None = None
    """When a running gang fell below its minimum."""

    request: tuple[int, int, int] = (0, 0, 0)
    """Total [gpu_milli, cpu_milli, memory_mib] over all pods, computed once.

    A pod asking for GPU memory rather than a fraction counts as one device here (its
    real share depends on the node it lands on; quotas charge the real slots).
    """

    def live(self) -> list[PodPlacement]:
        """Placements of pods that have not finished: what the job holds now."""
        if not self.finished:
            return list(self.placements.values())
        return [p for p in self.placements.values() if p.pod not in self.finished]

    def __post_init__(self) -> None:
        self.request = (
            sum(p.gpu_milli or (MILLI if p.gpu_memory_mib else 0) for p in self.pods),
            sum(p.cpu_milli for p in self.pods),
            sum(p.memory_mib for p in self.pods),
        )

    @property
    def pending_key(self) -> tuple[int, int, str]:
        """Order inside a queue: priority, then age (submission sequence), then id."""
        return (-self.priority, self.seq, self.job)


GANG_POLICIES: Final = ("gpuledger", "kai")
"""The policies that run the hierarchical gang policy (``kai`` with KAI-Scheduler's knobs)."""


@dataclass(slots=True)
class JobShape:
    """What decides a pending job's fit by shape, worked out once per pending job (its pods,
    request, preemptibility and expected runtime never change; ``placement.job_shape``)."""

    job: Job
    memo: tuple[tuple[object, ...], tuple[int, ...]] | None
    """``placement.FailedShapes.shape`` (None: the memo cannot judge the job)."""
    skip: tuple[object, ...] | None
    """``memo`` with the request, preemptibility and expected runtime (``allocate.skip_id``)."""
    uniform: int
    """The pod size of a plain gang of like pods, all required (``placement.uniform_size``);
    0: not such a gang."""
    skip_id: int
    """``skip`` as a small number (``allocate.skip_id``: -1 none, -2 not numbered yet)."""

    def __init__(
        self,
        job: Job,
        memo: tuple[tuple[object, ...], tuple[int, ...]] | None,
        skip: tuple[object, ...] | None,
        uniform: int,
    ) -> None:
        # (written out: compiled, a dataclass's generated ``__init__`` runs as Python)
        self.job = job
        self.memo = memo
        self.skip = skip
        self.uniform = uniform
        self.skip_id = -2


@dataclass(slots=True)
class Reservation:
    """Nodes held for a blocked job from ``start`` (NEVER: unknown) on (``backfill``).
    ``draining``: the job could start now but for jobs backfilled under it that do not
    give way (their work is older than ``backfill_give_way_ms``, or beyond the lost-work
    budget): it waits for them to end, and no more jobs are backfilled onto its nodes.
    Only under a give-way bound: without one (-1) nothing drains, as in revision 12."""

    job: str
    start: int
    nodes: dict[str, None]
    draining: bool

    def __init__(
        self, job: str, start: int, nodes: dict[str, None], draining: bool = False
    ) -> None:
        # (written out: compiled, a dataclass's generated ``__init__`` runs as Python)
        self.job = job
        self.start = start
        self.nodes = nodes
        self.draining = draining


@dataclass(slots=True)
class UniformGangs:
    """The pending plain gangs of one pod size, by pod size and gang size
    (``backfill.uniform_gangs``): the ids indexed, in the order first seen, and those
    added to a pending order since (``State.add_pending``), still to be indexed. Ids that
    left a pending order or got placements are dropped when read."""

    by_size: dict[int, dict[int, dict[str, None]]] = field(default_factory=dict)
    added: list[str] = field(default_factory=list)


@dataclass(slots=True)
class PlannedMemo:
    """The reservations a cycle worked out (``Session.planned``, by shape or job), with
    what they rest on besides the allocations: see ``backfill.carried_plans``."""

    changes: int
    """``State.changes_cache`` when they were worked out."""
    overrun: int
    """How many running jobs had overrun their expected end then."""
    latest: int
    """The latest start of the reservations kept (NEVER where one has no known start,
    or the job never fits)."""
    planned: dict[tuple[object, ...], Reservation | None]
    """Key -> the reservation (None: the job never fits)."""

    def __init__(
        self,
        changes: int,
        overrun: int,
        latest: int,
        planned: dict[tuple[object, ...], Reservation | None],
    ) -> None:
        # (written out: compiled, a dataclass's generated ``__init__`` runs as Python)
        self.changes = changes
        self.overrun = overrun
        self.latest = latest
        self.planned = planned


@dataclass(slots=True)
class FailedMemo:
    """The shapes that found no room by the end of a cycle (``placement.FailedShapes``), for
    the next one while nothing has given capacity back: see ``allocate.carried_failures``."""

    freed: int
    """``State.freed_cache`` when they were kept."""
    failures: dict[object, dict[tuple[object, ...], list[tuple[int, ...]]]]
    """``FailedShapes.failed``: blocked token -> kind -> the smallest requests that failed."""

    def __init__(
        self, freed: int, failures: dict[object, dict[tuple[object, ...], list[tuple[int, ...]]]]
    ) -> None:
        # (written out: compiled, a dataclass's generated ``__init__`` runs as Python)
        self.freed = freed
        self.failures = failures


@dataclass(slots=True)
class ShareMemo:
    """The last cycle's division of fair shares (``fairshare.cycle_shares``) and what it
    rested on besides the queue tree (a change to which drops the memo)."""

    config: PolicyConfigured
    """The policy configuration it was divided under (by identity)."""
    topology: int
    """``State.topology`` then: the capacity divided."""
    demand: dict[str, list[int]]
    fair: dict[str, list[int]]
    deserved: dict[str, list[int]]

    def __init__(
        self,
        config: PolicyConfigured,
        topology: int,
        demand: dict[str, list[int]],
        fair: dict[str, list[int]],
        deserved: dict[str, list[int]],
    ) -> None:
        # (written out: compiled, a dataclass's generated ``__init__`` runs as Python)
        self.config = config
        self.topology = topology
        self.demand = demand
        self.fair = fair
        self.deserved = deserved


@dataclass(slots=True)
class State:
    """Everything the policy needs, folded from the ledger."""

    now: int = 0
    policy: str = "gpuledger"
    config: PolicyConfigured = field(default_factory=PolicyConfigured)
    """The policy knobs in force (the last ``policy_configured``)."""
    nodes: dict[str, Node] = field(default_factory=dict)
    queues: dict[str, Queue] = field(default_factory=dict)
    jobs: dict[str, Job] = field(default_factory=dict)
    """Every job that may still matter to scheduling: submitted and not yet ended, or ended
    but still referred to (pods still placed, still in a pending order); see ``ended``."""
    ended: dict[str, int] = field(default_factory=dict)
    """Ended jobs, forgotten but for their id: id -> ``ended_code`` (how it ended, its last
    attempt), in the order they ended. A job moves here from ``jobs`` when it reaches a
    terminal status holding nothing, so a long run keeps ~100 bytes per ended job instead of
    the whole job; the id keeps a re-submission refused (intake) and ignored (``apply``),
    and late events about it are recognised and ignored."""
    seq: int = 0
    pending: list[tuple[int, int, str]] = field(default_factory=list)
    """Every pending job, in any queue or none, as sorted (-priority, seq, job id)."""
    topology: int = 0
    """Bumped by every node event; derived per-topology caches key on it."""
    node_lost: tuple[int, str] = (-1, "")
    """When the last node was removed or cordoned, and which (a reservation counting on it
    says so when it moves later)."""
    empty_nodes: tuple[int, dict[str, Node], FreeIndex | None, dict[ShapeKey, bool]] = (
        -1,
        {},
        None,
        {},
    )
    """Cache: (topology, the schedulable nodes with nothing on them, their free index,
    per job shape whose pods all have a node, whether the gang packs onto them; see
    ``neverfits._cluster_reason``)."""
    free_index_cache: FreeIndex | None = None
    """Cache: nodes by free GPUs (built on first use, dropped when nodes come or go)."""
    wanted_cache: dict[str, list[int]] | None = None
    """Cache: per queue, the summed request of its pending jobs (built on first use, kept
    by ``add_pending``/``remove_pending``, dropped when the queue tree changes)."""
    running_cache: RunningIndex | None = None
    """Cache: the running jobs by expected end and in victim order (built on first use,
    kept current by ``apply``, dropped when the queue tree changes)."""
    capacity_cache: tuple[int, tuple[int, ...]] = (-1, ())
    """Cache: (topology, total schedulable [gpu, cpu, memory])."""
    blocks_cache: dict[str, PendingBlocks] = field(default_factory=dict)
    """Cache: per leaf queue, its pending order in blocks summed up for admission
    (``pendingblocks``; built on first use, kept by ``add_pending``/``remove_pending``,
    dropped when the queue tree changes)."""
    shape_cache: dict[str, JobShape] = field(default_factory=dict)
    """Cache: per pending job, what decides its fit by shape (``placement.job_shape``),
    dropped by ``remove_pending``."""
    changes_cache: int = 0
    """Cache: counts the applied events that can change what a reservation is worked out
    from (every event ``apply`` folds but a new job's submission, a pod's start, a reason
    and a cycle's end; ``apply._QUIET``)."""
    started_end_cache: int = NEVER
    """Cache: the earliest expected end, as it was before and as it is after their start,
    of the jobs whose gangs started since the last cycle kept its reservations
    (``backfill.keep_plans``; NEVER: none). A start moves only the started job's end, so
    a reservation that starts before both stands (``backfill.carried_plans``)."""
    uniform_cache: UniformGangs | None = None
    """Cache: the pending plain gangs by pod size and gang size (built on first use, kept
    by ``add_pending`` and when read; dropped when the queue tree changes, or when more
    jobs were added since it was read than are pending)."""
    freed_cache: int = 0
    """Cache: counts the applied events that may give capacity back or change where pods
    may go (every event ``apply`` folds but a new job's submission, a placement, a pod's
    start, a reason and a cycle's end; ``apply._NO_ROOM_MADE``)."""
    failed_cache: FailedMemo | None = None
    """Cache: what found no room by the end of the last cycle, for the next one to rule
    out while nothing has given capacity back (``allocate.carried_failures``)."""
    planned_cache: PlannedMemo | None = None
    """Cache: the reservations the last cycle worked out, for the next one to reuse while
    nothing they rest on changed (``backfill.carried_plans``)."""
    share_cache: ShareMemo | None = None
    """Cache: the last cycle's fair shares, reused while only demands that no share met
    changed (``fairshare.cycle_shares``; dropped when the queue tree changes)."""
    tuning: Tuning = DEFAULT
    """The runner's shortcuts and bounds (``scheduler.core.tuning``): never folded, as no
    event sets them; a recorded ledger replays under ``DEFAULT``, tests construct others."""
    cordoned_cache: tuple[int, list[Node]] = (-1, [])
    """Cache: (topology, the cordoned nodes), for ``free_schedulable``."""
    skip_ids_cache: dict[tuple[object, ...], int] = field(default_factory=dict)
    """Cache: a number for each skip key seen (``allocate.skip_id``): the walk behind a
    blocked head compares numbers, not nested tuples."""
    kept_off_ids_cache: dict[tuple[str, ...], int] = field(default_factory=dict)
    """Cache: a number (from 1) for each set of nodes a job behind a reservation keeps off
    (``allocate._kept_off``): the memos of failed shapes key on it, as a tuple of node names
    would be hashed at every look-up."""
    stale: dict[str, None] = field(default_factory=dict)
    """Running gangs below their minimum, by when they fell (insertion order)."""
    wakeup: int | None = None
    """The earliest time a time-based rule needs a cycle (None: none pending)."""
    usage: dict[str, int] = field(default_factory=dict)
    """Time-based fair share: decayed GPU-milli·ms used per queue."""
    usage_at: int = 0
    usage_alloc: dict[str, int] = field(default_factory=dict)
    """GPU allocation per queue at the end of the last cycle (accrues until the next)."""
    fresh: list[str] = field(default_factory=list)
    """Jobs submitted since the last cycle, to be checked for 'can never fit'."""
    held: dict[str, dict[str, HeldPod]] = field(default_factory=dict)
    """Pods the ledger no longer schedules but the cluster still runs: job -> pod -> where.
    Survivors of a terminated job and victims whose eviction failed keep their node's
    resources taken until they are reported gone, so no device is handed out twice."""
    broken: dict[str, str] = field(default_factory=dict)
    """Placed jobs that can no longer run as placed (a gang below its minimum after pods
    were lost), with why, in the order they broke; the next cycle ends each one."""
    dirty: bool = True
    """Something changed that could let a pending job start; a clean cycle is a no-op."""
    policy_ran_at: int = -1
    """Ledger time of the last cycle that ran with fresh inputs (its ``CycleCompleted``
    found the state dirty; -1: none yet). The victim-search back-off counts its periods
    from it (``victims.backing_off``); folded from the ledger, so a replay or a restored
    snapshot knows it as the scheduler that wrote the ledger did."""
    reserved: dict[str, int] = field(default_factory=dict)
    """Nodes held by the reservations of the last cycle that ran a policy, with when each
    is expected to start (``running.NEVER``: when running jobs end). Derived by the cycle,
    never folded from the ledger nor carried in snapshots; read by monitors (work
    conservation counts capacity a reservation holds as spoken for)."""

    def known(self, job_id: str) -> bool:
        """Whether the id was ever submitted (and accepted): live or ended."""
        return job_id in self.jobs or job_id in self.ended

    def status_of(self, job_id: str) -> str | None:
        """A job's status, ended or not; None for an id never submitted."""
        job = self.jobs.get(job_id)
        if job is not None:
            return job.status
        code = self.ended.get(job_id)
        return None if code is None else ended_status(code)

    def status_counts(self) -> dict[str, int]:
        """How many jobs have each status, ended ones included, by status name."""
        counts: dict[str, int] = {}
        for job in self.jobs.values():
            counts[job.status] = counts.get(job.status, 0) + 1
        ended = [0] * len(TERMINAL)
        for code in self.ended.values():
            ended[code & 3] += 1
        for status, count in zip(TERMINAL, ended, strict=True):
            if count:
                counts[status] = counts.get(status, 0) + count
        return dict(sorted(counts.items()))

    def add_pending(self, job: Job) -> None:
        """Put a job in its queue's pending order (creating no queue)."""
        key = job.pending_key
        insort(self.pending, key)
        queue = self.queues.get(job.queue)
        if queue is not None:
            insort(queue.pending, key)
            blocks = self.blocks_cache.get(queue.name)
            if blocks is not None:
                blocks.added(queue.pending, key)
            if self.wanted_cache is not None:
                _add_request(self.wanted_cache, queue.name, job.request, 1)
            uniform = self.uniform_cache
            if uniform is not None:
                uniform.added.append(job.job)
                if len(uniform.added) > len(self.pending):
                    # rebuilding from the pending orders now costs less than catching up
                    self.uniform_cache = None

    def remove_pending(self, job: Job) -> None:
        """Take a job out of the pending orders, where it is there."""
        key = job.pending_key
        _remove_sorted(self.pending, key)
        self.shape_cache.pop(job.job, None)
        queue = self.queues.get(job.queue)
        if queue is not None and _remove_sorted(queue.pending, key):
            blocks = self.blocks_cache.get(queue.name)
            if blocks is not None:
                blocks.removed(key)
            if self.wanted_cache is not None:
                _add_request(self.wanted_cache, queue.name, job.request, -1)

    def pending_blocks(self, queue: Queue) -> PendingBlocks:
        """The queue's pending order in blocks (``pendingblocks``), built when first needed."""
        blocks = self.blocks_cache.get(queue.name)
        if blocks is None:
            blocks = self.blocks_cache[queue.name] = PendingBlocks.of(
                queue.pending, self.tuning.block
            )
        return blocks

    def wanted(self, queue: Queue) -> list[int]:
        """The summed [gpu, cpu, memory] request of the queue's pending jobs, and how many
        of them ask for no GPU."""
        if self.wanted_cache is None:
            cache: dict[str, list[int]] = {}
            for q in self.queues.values():
                for _, _, job_id in q.pending:
                    _add_request(cache, q.name, self.jobs[job_id].request, 1)
            self.wanted_cache = cache
        return self.wanted_cache.get(queue.name, [0, 0, 0, 0])

    def in_pending(self, job: Job) -> bool:
        """Whether the job's key is in a pending order (its status may say otherwise)."""
        key = job.pending_key
        queue = self.queues.get(job.queue)
        return _in_sorted(self.pending, key) or (
            queue is not None and _in_sorted(queue.pending, key)
        )

    def in_leaf_pending(self, job: Job) -> bool:
        """Whether the job's key is in its queue's pending order and that queue is a leaf
        (the orders the policy walks)."""
        queue = self.queues.get(job.queue)
        return (
            queue is not None and not queue.children and _in_sorted(queue.pending, job.pending_key)
        )

    def free_index(self) -> FreeIndex:
        """The free-capacity index over the nodes, built when first needed."""
        if self.free_index_cache is None:
            self.free_index_cache = FreeIndex.of(self.nodes)
        return self.free_index_cache

    def free_schedulable(self) -> int:
        """Milli-GPUs free on the nodes that are not cordoned: the free index's total less
        the cordoned nodes' (listed once per topology), not a sum over every node."""
        total = self.free_index().total
        version, cordoned = self.cordoned_cache
        if version != self.topology:
            cordoned = [n for n in self.nodes.values() if n.cordoned]
            self.cordoned_cache = (self.topology, cordoned)
        for node in cordoned:
            total -= node.free_gpu_milli
        return total

    def running_index(self) -> RunningIndex:
        """The running jobs by expected end and in victim order, built when first needed."""
        if self.running_cache is None:
            self.running_cache = RunningIndex.of(self)
        return self.running_cache

    def ancestors(self, queue: str) -> list[Queue]:
        """The queue itself and its ancestors, leaf first (stops at a missing parent)."""
        chain: list[Queue] = []
        name = queue
        seen = 0
        while name and name in self.queues and seen <= len(self.queues):
            q = self.queues[name]
            chain.append(q)
            name = q.parent
            seen += 1
        return chain

    def leaf_queues(self) -> list[Queue]:
        """Queues with no children, by name."""
        return [self.queues[n] for n in sorted(self.queues) if not self.queues[n].children]

    def queue_path(self, queue: str) -> str:
        """``root/child/leaf`` for a queue."""
        return "/".join(q.name for q in reversed(self.ancestors(queue)))


@dataclass(slots=True)
class FreeIndex:
    """Node names by free milli-GPUs, each bucket sorted by name.

    Placement walks it instead of every node: ascending for bin-packing (the first node
    that fits is the best fit), descending for spreading. ``take``/``give_back`` keep it
    current; it is a derived cache, rebuilt when nodes come or go.
    """

    buckets: dict[int, list[str]] = field(default_factory=dict)
    keys: list[int] = field(default_factory=list)
    total: int = 0
    """Free milli-GPUs summed over every indexed node (kept by ``move``)."""

    @classmethod
    def of(cls, nodes: dict[str, Node]) -> FreeIndex:
        """Index every node."""
        index = cls()
        for node in nodes.values():
            insort(index.buckets.setdefault(node.free_gpu_milli, []), node.name)
            index.total += node.free_gpu_milli
        index.keys = sorted(index.buckets)
        return index

    def move(self, name: str, old: int, new: int) -> None:
        """A node's free GPUs went from ``old`` to ``new``."""
        if old == new:
            return
        self.total += new - old
        bucket = self.buckets[old]
        del bucket[bisect_left(bucket, name)]
        if not bucket:
            del self.buckets[old]
            del self.keys[bisect_left(self.keys, old)]
        target = self.buckets.get(new)
        if target is None:
            self.buckets[new] = [name]
            insort(self.keys, new)
        else:
            insort(target, name)

    def slots_at_most(self, size: int) -> int:
        """At most how many pods of ``size`` milli-GPUs fit the free GPUs: a cheap bound
        (each node counts its free total, ignoring how it is split across devices)."""
        buckets = self.buckets
        return sum(
            len(buckets[key]) * (key // size) for key in self.keys[bisect_left(self.keys, size) :]
        )

    def ascending(self, minimum: int) -> Iterator[str]:
        """Names of nodes with at least ``minimum`` free, least free first, then by name.

        Lazy: the caller stops at the first node that fits, and must not resume the walk
        after changing the index.
        """
        for key in self.keys[bisect_left(self.keys, minimum) :]:
            yield from self.buckets[key]

    def descending(self, minimum: int) -> Iterator[str]:
        """Names of nodes with at least ``minimum`` free, most free first, then by name."""
        for key in reversed(self.keys[bisect_left(self.keys, minimum) :]):
            yield from self.buckets[key]


def _in_sorted(items: list[tuple[int, int, str]], key: tuple[int, int, str]) -> bool:
    index = bisect_left(items, key)
    return index < len(items) and items[index] == key


def _remove_sorted(items: list[tuple[int, int, str]], key: tuple[int, int, str]) -> bool:
    """Remove ``key`` from a sorted list of unique keys, if present (True if it was)."""
    index = bisect_left(items, key)
    if index < len(items) and items[index] == key:
        del items[index]
        return True
    return False


def _add_request(
    sums: dict[str, list[int]], queue: str, request: tuple[int, int, int], sign: int
) -> None:
    row = sums.get(queue)
    if row is None:
        row = sums[queue] = [0, 0, 0, 0]
    row[0] += sign * request[0]
    row[1] += sign * request[1]
    row[2] += sign * request[2]
    if not request[0]:
        row[3] += sign


def node_from_capacity(
    name: str, gpus: int, cpu_milli: int, memory_mib: int, labels: dict[str, str]
) -> Node:
    """A node with everything free (its GPU model and memory, taints: set by the caller)."""
    return Node(
        name=name,
        gpus=gpus,
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        labels=dict(labels),
        free_devices=[MILLI] * gpus,
        free_gpu_milli=gpus * MILLI,
        free_whole=gpus,
        free_cpu=cpu_milli,
        free_memory=memory_mib,
    )


def required(job: Job) -> int:
    """How many pods the gang needs running at once."""
    return job.min_members or len(job.pods)


def wake(state: State, at: int) -> None:
    """Ask for a cycle at ``at`` (a time-based rule falls due then)."""
    if state.wakeup is None or at < state.wakeup:
        state.wakeup = at
