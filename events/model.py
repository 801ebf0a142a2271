"""The event catalogue: every fact and every decision gpuledger records.

Events are frozen msgspec Structs forming one closed tagged union (``Event``). Tags are
explicit, stable snake_case strings: renaming a class never changes the wire format.
Evolution is additive only — a new field gets a default, a field's type never changes, a
change of meaning is a new event type (see docs/events.md).

Units are integers everywhere, so that arithmetic in the policy core is exact and replays
byte for byte: time in milliseconds, GPUs in milli-GPUs (1000 = one whole device; 250 = a
quarter of one device), CPU in millicores, memory in MiB.
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

from events.knobs import Knob, knob_table

MILLI: Final = 1000
"""One whole GPU in milli-GPUs."""

MAX_NODE_GPUS = 4096
"""The most GPU devices one node may announce. The core keeps state per device, so intake
and the loaders refuse more (a node of 2**40 GPUs would exhaust memory) rather than crash."""


class Resources(msgspec.Struct, frozen=True):
    """An amount of the three scheduled resources."""

    gpu_milli: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0


class PodSpec(msgspec.Struct, frozen=True):
    """One member of a gang.

    ``gpu_milli`` is either a multiple of 1000 (whole devices) or below 1000 (a fraction of
    a single device, shared with other fractional pods up to 1.0 of it).
    """

    name: str
    gpu_milli: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0
    node_selector: dict[str, str] = {}
    group: str = ""
    """Sub-group of the gang (e.g. ``leader``, ``worker``), for per-group minimums."""
    gpu_memory_mib: int = 0
    """A fraction of one GPU asked for as device memory (used when ``gpu_milli`` is 0)."""
    tolerations: tuple[str, ...] = ()
    """Taints tolerated: ``key`` (any value) or ``key=value``."""
    uid: str = ""
    """The pod object's UID on a live cluster (empty in simulations): the binder binds and
    evicts only that object, never a pod re-created under the same name."""


class GpuSlot(msgspec.Struct, frozen=True, array_like=True):
    """A share of one GPU device on a node: device index and milli-GPUs taken."""

    device: int
    milli: int


class PodPlacement(msgspec.Struct, frozen=True):
    """Where one pod of a gang goes."""

    pod: str
    node: str
    gpus: tuple[GpuSlot, ...] = ()


class Event(msgspec.Struct, frozen=True, tag_field="type", kw_only=True):
    """Base of the closed union; never instantiated itself."""


# --------------------------------------------------------------------------- cluster facts


class NodeRegistered(Event, frozen=True, tag="node_registered"):
    """A node joined (or re-announced itself, replacing its capacity and labels)."""

    node: str
    gpus: int
    gpu_model: str = ""
    gpu_memory_mib: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0
    labels: dict[str, str] = {}
    taints: tuple[str, ...] = ()
    """``key=value:effect`` or ``key:effect``; a pod must tolerate each to be placed."""


class NodeRemoved(Event, frozen=True, tag="node_removed"):
    """A node left the cluster; pods on it are lost."""

    node: str


class NodeCordoned(Event, frozen=True, tag="node_cordoned"):
    """A node stops (``cordoned=True``) or resumes taking new pods."""

    node: str
    cordoned: bool = True


class QueueConfigured(Event, frozen=True, tag="queue_configured"):
    """A queue was created or its configuration replaced.

    ``deserved`` is the guaranteed quota; ``deserved_gpu_percent`` (0–100), when set,
    overrides ``deserved.gpu_milli`` with that percentage of the parent's deserved GPUs
    (of the cluster for a top-level queue). ``limit`` fields of -1 mean "no limit".
    """

    queue: str
    parent: str = ""
    deserved: Resources = Resources()
    deserved_gpu_percent: int | None = None
    over_quota_weight: int = 1
    limit: Resources = Resources(gpu_milli=-1, cpu_milli=-1, memory_mib=-1)
    priority: int = 0
    preempt_min_runtime_ms: int = 0
    """A job of this queue that started less than this ago is not preempted."""
    reclaim_min_runtime_ms: int = 0
    """A job of this queue that started less than this ago is not reclaimed."""
    placement: str = ""
    """Default placement for its jobs: ``binpack`` or ``spread`` (empty: the policy's)."""


class QueueRemoved(Event, frozen=True, tag="queue_removed"):
    """A queue was deleted. Its pending jobs are rejected; running ones keep running."""

    queue: str


# --------------------------------------------------------------------------- job facts


class JobSubmitted(Event, frozen=True, tag="job_submitted"):
    """A gang of pods was submitted to a queue.

    The gang is placed all-or-nothing on ``min_members`` pods (default: all of them).
    ``preemptible`` defaults from the priority class (below 100 is preemptible).
    """

    job: str
    queue: str
    pods: tuple[PodSpec, ...]
    min_members: int = 0
    priority_class: str = "train"
    preemptible: bool | None = None
    expected_runtime_ms: int | None = None
    checkpoint_interval_ms: int | None = None
    min_per_group: dict[str, int] = {}
    """Minimum running pods per sub-group (``PodSpec.group``), on top of ``min_members``."""
    topology_key: str = ""
    """Node label whose value the gang's pods should share (e.g. a rack)."""
    topology_required: bool = False
    """True: all pods in one topology domain or none; False: preferred."""
    placement: str = ""
    """``binpack`` or ``spread`` for this job (empty: the queue's, then the policy's)."""


class JobCancelled(Event, frozen=True, tag="job_cancelled"):
    """The owner withdrew the job; its pods are released."""

    job: str


class PodStarted(Event, frozen=True, tag="pod_started"):
    """The kubelet reports the pod's containers running."""

    job: str
    pod: str


class PodFinished(Event, frozen=True, tag="pod_finished"):
    """The pod exited."""

    job: str
    pod: str
    succeeded: bool = True


class PodDeleted(Event, frozen=True, tag="pod_deleted"):
    """The pod object is gone from the cluster (deleted by a person or a controller, evicted
    by someone else, garbage-collected with its node) while the ledger still knew it.

    The pod's resources are free from now on. A pending job cannot run as submitted any
    more and is cancelled; a placed gang left below its minimum is ended by the next cycle
    (``JobTerminated``).
    """

    job: str
    pod: str
    node: str = ""
    reason: str = ""


class Tick(Event, frozen=True, tag="tick"):
    """Clock advance with no other news, so time-based rules run on an idle cluster."""


class PolicyConfigured(Event, frozen=True, tag="policy_configured"):
    """The scheduling policy in force from now on; recorded so a replay uses the same one.

    ``policy`` is ``gpuledger`` (hierarchical gang policy), ``kai`` (the gang policy with
    KAI-Scheduler's knobs), ``fifo`` (a model of the default kube-scheduler: no queues, no
    gangs, no preemption), or one of the baselines ``drf`` and ``easy``.

    Every other field but ``revision`` and ``requeue_lost`` is a policy knob, declared here
    once: its default is the neutral one that keeps older ledgers' behaviour, and its
    ``Knob`` (``events.knobs``) says how ``policy.yaml`` writes it, the value recommended
    there, KAI-Scheduler's value under ``--policy kai`` and a line of doc. ``POLICY_KNOBS``
    is the table of them; a new knob is a new field with a ``Knob`` and such a default.
    """

    policy: str = "gpuledger"
    reclaim: Annotated[bool, Knob("take back fair share / deserved quota across queues")] = True
    preempt: Annotated[bool, Knob("strictly higher priority evicts within a queue")] = True
    revision: int = 1
    """The policy core's semantics revision that wrote the ledger (see docs/policy.md)."""
    backfill: Annotated[
        bool, Knob("reservations for blocked heads; smaller jobs use the gap", recommended=True)
    ] = False
    consolidation: Annotated[
        bool,
        Knob("move preemptible jobs to defragment when every moved job is re-placed", kai=True),
    ] = False
    stale_gang_eviction: Annotated[
        bool, Knob("evict a running gang that fell below its minimum", recommended=True)
    ] = False
    stale_gang_grace_ms: Annotated[
        int, Knob("how long a gang may stay below its minimum before it is evicted", unit="ms")
    ] = 60_000
    placement: Annotated[
        str, Knob("binpack or spread; queues and jobs may override", choices=("binpack", "spread"))
    ] = "binpack"
    half_life_ms: Annotated[
        int, Knob("time-based fair share: usage half-life; 0 = off", unit="ms")
    ] = 0
    """Time-based fair share: usage decays with this half-life; 0 turns it off."""
    k_value_milli: Annotated[
        int, Knob("how strongly past usage moves over-quota shares", unit="milli")
    ] = 1000
    """How strongly past usage moves over-quota shares (KAI's kValue), times 1000."""
    bind_backoff_ms: Annotated[
        int,
        Knob(
            "back-off after a failed bind, doubled per failure; 0 = off", unit="ms", recommended=10
        ),
    ] = 0
    """Base back-off after a BindFailed, doubled per failure; 0 turns it off."""
    bind_backoff_max_ms: Annotated[
        int, Knob("the longest the bind back-off grows to", unit="ms")
    ] = 600_000
    requeue_lost: bool = True
    """What a job whose pods are lost with their node becomes. True: it goes back to pending
    whole and is placed again (the simulator's model of a controller re-running it). False
    (live clusters, where a pod is an API object that cannot be bound twice): the lost pods
    are released, a gang left below its minimum is ended with ``JobTerminated`` and its
    surviving pods evicted, and a preempted job ends instead of waiting again (its evicted
    pods are gone; a controller re-creating them makes a new submission)."""
    lost_work_ratio_milli: Annotated[
        int,
        Knob(
            "backfill / over-quota reclaim may lose at most this x the GPU time the preemptor "
            "waited; 0 = no bound (docs/policy.md §5)",
            unit="milli",
            recommended=0.1,
            kai=0,
        ),
    ] = 0
    """Preemption that pays for itself: the victims a job evicts by ``reclaim`` or
    ``backfill`` may lose, together, at most this ratio (x1000) of the GPU time the job has
    waited (its GPUs x the time since it was submitted). 0: no bound."""
    backfill_give_way_ms: Annotated[
        int,
        Knob(
            "a job backfilled under a reservation gives way only younger than this (per GPU, "
            "since start or checkpoint); older ones are waited for; null = no bound "
            "(docs/policy.md §6)",
            unit="ms",
            recommended=1800,
            null=-1,
        ),
    ] = -1
    """A job backfilled under a reservation gives way to it only while the work it would
    lose is younger than this (its lost GPU-ms per GPU it holds: the time since it started,
    or since its last checkpoint); an older one is waited for, and no more jobs are
    backfilled onto the reservation's nodes meanwhile (``Reservation.draining``). -1: no
    such bound (revision 12 and earlier)."""
    reclaim_hysteresis_ms: Annotated[
        int,
        Knob(
            "a job that started by reclaiming is not reclaimed back for this long; 0 = off "
            "(docs/policy.md §5)",
            unit="ms",
            recommended=3600,
            kai=0,
        ),
    ] = 0
    """A job that started by reclaiming is not reclaimed itself for this long after it was
    placed, so two queues do not take the same GPUs back and forth. 0: no hysteresis."""
    share_rounding: Annotated[
        str,
        Knob(
            "over-quota division: milli (exact) or whole (KAI-Scheduler's whole units; "
            "docs/policy.md §1)",
            kai="whole",
            choices=("milli", "whole"),
        ),
    ] = "milli"
    """How fair share divides what is over quota (docs/policy.md §1). ``milli``: exact
    water-filling in milli-units. ``whole``: KAI-Scheduler's division, each queue's portion
    floored to whole units (1 GPU, 1 milli-CPU, 1 MiB) and the units left over given by
    largest fraction, then the order the queues were configured in, then name."""
    victim_order: Annotated[
        str,
        Knob(
            "gpuledger (fewest victims losing the least work) or kai (lower-priority queues, "
            "then lower-priority and newer jobs first; docs/policy.md §5)",
            kai="kai",
            choices=("gpuledger", "kai"),
        ),
    ] = "gpuledger"
    """The order victims are taken in (docs/policy.md §5). ``gpuledger``: least lost work
    first, and a set of victims is replaced by a single one that alone makes room losing
    no more work. ``kai``: KAI-Scheduler's, lower-priority queues first, then lower-priority
    and newer jobs, taken as they come."""
    reservations: Annotated[
        bool,
        Knob(
            "with backfill, a blocked head reserves its nodes; false: KAI-Scheduler's, nothing "
            "held (docs/policy.md §6)",
            kai=False,
        ),
    ] = True
    """With ``backfill``: a queue's head that cannot start reserves the nodes it will get
    (EASY backfill). False: KAI-Scheduler's, nothing is held for it, and every later job
    that fits starts (docs/policy.md §6)."""
    queue_order: Annotated[
        str,
        Knob(
            "gpuledger (leaf queues ranked on their own) or kai (level by level by the share "
            "after the head job; docs/policy.md §2)",
            kai="kai",
            choices=("gpuledger", "kai"),
        ),
    ] = "gpuledger"
    """The order queues are served in (docs/policy.md §2). ``gpuledger``: leaf queues ranked
    on their own. ``kai``: KAI-Scheduler's, level by level down the tree, each queue ranked
    by the share it would have after taking its best head job."""
    victim_search_backoff_ms: Annotated[
        int,
        Knob(
            "a head that would reclaim beyond its deserved quota searches for victims once "
            "per this period; 0 = in every cycle (docs/policy.md §5)",
            unit="ms",
            recommended=30,
        ),
    ] = 0
    """A queue's head that would reclaim beyond its deserved quota (a search its lost-work
    budget bounds) searches for victims once per this period of ledger time
    (``victims.backing_off``); reclaim within deserved quota, preemption by priority and
    a reservation's start search in every cycle. 0: every search in every cycle."""


POLICY_KNOBS: tuple[Knob, ...] = knob_table(PolicyConfigured)
"""The policy knobs of ``PolicyConfigured``, in field order: the one table ``policy.yaml``,
its conversion to the event and ``--policy kai`` are derived from."""


# --------------------------------------------------------------------------- decisions


class PodsAllocated(Event, frozen=True, tag="pods_allocated"):
    """The scheduler placed these pods of a job (a whole gang under the gang policy)."""

    job: str
    queue: str
    placements: tuple[PodPlacement, ...]
    backfill_for: str = ""
    """Set when the job was backfilled into the gap before this job's reservation."""


class JobPreempted(Event, frozen=True, tag="job_preempted"):
    """A running job was evicted to make room for ``preemptor``.

    ``rule`` is ``reclaim`` (across queues, to restore a fair share), ``preempt`` (within
    a queue, by strictly higher priority), ``backfill`` (a backfilled job giving way to the
    reservation it ran under), ``stale-gang`` (a running gang fell below its minimum;
    ``preemptor`` is empty) or ``consolidation`` (moved to defragment; re-placed at once).
    ``lost_gpu_ms`` is the GPU-weighted work since the victim's last checkpoint, in
    GPU-milliseconds; ``checkpointed_ms`` is the progress it keeps.
    """

    job: str
    queue: str
    pods: tuple[str, ...]
    preemptor: str
    preemptor_queue: str
    rule: str
    lost_gpu_ms: int
    checkpointed_ms: int = 0


class JobUnschedulable(Event, frozen=True, tag="job_unschedulable"):
    """The job cannot be placed now, with a reason a person can act on.

    ``final`` means it can never fit this cluster as it stands (more GPUs than any node
    set offers, a selector no node satisfies); such a job leaves the pending queue at once
    instead of waiting forever. Non-final reasons are recorded when they change.
    """

    job: str
    queue: str
    reason: str
    final: bool = False
    cause: str = ""
    """What blocks the job, a stable key (docs/policy.md §7): ``never_fits``, ``limit``,
    ``quota``, ``share``, ``mismatch``, ``reserved``, ``behind``, ``reservation``,
    ``capacity``, ``backoff``; empty in ledgers written before revision 7."""
    start: int = -1
    """For ``reservation`` and ``reserved``: when (ms) the job's own reservation is promised
    to start; -1 when there is none or its time is not known."""


class JobTerminated(Event, frozen=True, tag="job_terminated"):
    """The scheduler ended a job that can no longer run as placed: a gang left below its
    minimum after members were deleted or lost with their node, or a pod bound elsewhere.

    The job ends as failed. ``pods`` are the pods the binder must remove; those still on a
    node keep holding their GPUs in the ledger until each is reported gone (``PodEvicted``
    or ``PodDeleted``), so nothing is placed on a device a terminating pod still uses.
    """

    job: str
    queue: str
    pods: tuple[str, ...]
    reason: str


class CycleCompleted(Event, frozen=True, tag="cycle_completed"):
    """A scheduling cycle ran over the inputs before it and made ``decisions`` decisions.

    It marks the cycle boundary in the ledger, which replay needs to re-run the same cycles.
    """

    decisions: int = 0


# --------------------------------------------------------------------------- binder outcomes


class PodBound(Event, frozen=True, tag="pod_bound"):
    """The binder bound the pod to its node."""

    job: str
    pod: str
    node: str


class BindFailed(Event, frozen=True, tag="bind_failed"):
    """The binder could not bind the pod; its allocation is released."""

    job: str
    pod: str
    node: str
    reason: str
    bound_node: str = ""
    """Set when the pod is already bound (to this node, by someone else or before): such a
    pod can never be bound again, so the allocation is not retried and the job ends."""


class PodEvicted(Event, frozen=True, tag="pod_evicted"):
    """The binder evicted the pod after a preemption."""

    job: str
    pod: str
    node: str


# --------------------------------------------------------------------------- monitoring


class GpuUtilizationSampled(Event, frozen=True, tag="gpu_utilization_sampled"):
    """A monitoring sample of one GPU device (e.g. DCGM via Prometheus), for drift reports.

    ``utilization_pct`` (0–100) is the device's busy percentage over the exporter's sample
    period and ``memory_used_mib`` its framebuffer in use. The policy core ignores these:
    they feed the ``gpu_usage`` projection (allocated versus utilised GPU-hours), never a
    scheduling decision, so importing monitoring data cannot change a replay.
    """

    node: str
    device: int
    utilization_pct: int
    memory_used_mib: int = 0


class JobRejected(Event, frozen=True, tag="job_rejected"):
    """Admission refused the job before scheduling (e.g. its namespace may not use the queue).

    An input recorded for audit: the policy core ignores it and the job is never scheduled.
    """

    job: str
    queue: str
    namespace: str = ""
    reason: str = ""


class EvictionFailed(Event, frozen=True, tag="eviction_failed"):
    """The binder could not evict a preempted pod: the API kept refusing (a
    PodDisruptionBudget answering 429, say) after bounded retries, or refused outright.

    The pod still runs, so the ledger holds its GPU slots (``gpus``) on ``node`` again until
    it is reported gone (``PodEvicted`` or ``PodDeleted``); a job the ledger had placed on
    those slots meanwhile gives way and waits again. The binder keeps retrying the eviction
    with back-off.
    """

    job: str
    pod: str
    node: str
    reason: str
    gpus: tuple[GpuSlot, ...] = ()
    cpu_milli: int = 0
    memory_mib: int = 0


AnyEvent = (
    NodeRegistered
    | NodeRemoved
    | NodeCordoned
    | QueueConfigured
    | QueueRemoved
    | JobSubmitted
    | JobCancelled
    | PodStarted
    | PodFinished
    | PodDeleted
    | Tick
    | PolicyConfigured
    | PodsAllocated
    | JobPreempted
    | JobUnschedulable
    | JobTerminated
    | CycleCompleted
    | PodBound
    | BindFailed
    | PodEvicted
    | GpuUtilizationSampled
    | JobRejected
    | EvictionFailed
)
"""The closed union of every event type this version understands."""

DECISION_TYPES: tuple[type[Event], ...] = (
    PodsAllocated,
    JobPreempted,
    JobUnschedulable,
    JobTerminated,
    CycleCompleted,
)
"""Events the policy core produces; everything else is an input."""

EVENT_TYPES: tuple[type[Event], ...] = (
    NodeRegistered,
    NodeRemoved,
    NodeCordoned,
    QueueConfigured,
    QueueRemoved,
    JobSubmitted,
    JobCancelled,
    PodStarted,
    PodFinished,
    Tick,
    PolicyConfigured,
    PodsAllocated,
    JobPreempted,
    JobUnschedulable,
    CycleCompleted,
    PodDeleted,
    JobTerminated,
    PodBound,
    BindFailed,
    PodEvicted,
    GpuUtilizationSampled,
    JobRejected,
    EvictionFailed,
)


def tag_of(event_type: type[Event]) -> str:
    """The stable wire tag of an event class."""
    tag = event_type.__struct_config__.tag
    assert isinstance(tag, str)
    return tag


TAGS: dict[str, type[Event]] = {tag_of(t): t for t in EVENT_TYPES}
DECISION_TAGS: frozenset[str] = frozenset(tag_of(t) for t in DECISION_TYPES)


def is_decision(event: Event) -> bool:
    """True for events the policy core produced."""
    return isinstance(event, DECISION_TYPES)


def event_key(event: Event) -> str:
    """The entity an event is about (job, node or queue): the log's partitioning key."""
    for field in ("job", "node", "queue"):
        value = getattr(event, field, None)
        if isinstance(value, str):
            return value
    return ""


__all__ = [
    "DECISION_TAGS",
    "DECISION_TYPES",
    "EVENT_TYPES",
    "MAX_NODE_GPUS",
    "MILLI",
    "POLICY_KNOBS",
    "TAGS",
    "AnyEvent",
    "BindFailed",
    "CycleCompleted",
    "Event",
    "EvictionFailed",
    "GpuSlot",
    "GpuUtilizationSampled",
    "JobCancelled",
    "JobPreempted",
    "JobRejected",
    "JobSubmitted",
    "JobTerminated",
    "JobUnschedulable",
    "NodeCordoned",
    "NodeRegistered",
    "NodeRemoved",
    "PodBound",
    "PodDeleted",
    "PodEvicted",
    "PodFinished",
    "PodPlacement",
    "PodSpec",
    "PodStarted",
    "PodsAllocated",
    "PolicyConfigured",
    "QueueConfigured",
    "QueueRemoved",
    "Resources",
    "Tick",
    "event_key",
    "is_decision",
    "tag_of",
]
