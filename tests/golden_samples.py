"""One representative instance of every event type, for the golden wire samples."""

from __future__ import annotations

from events.model import (
    BindFailed,
    CycleCompleted,
    Event,
    EvictionFailed,
    GpuSlot,
    GpuUtilizationSampled,
    JobCancelled,
    JobPreempted,
    JobRejected,
    JobSubmitted,
    JobTerminated,
    JobUnschedulable,
    NodeCordoned,
    NodeRegistered,
    NodeRemoved,
    PodBound,
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
    Resources,
    Tick,
)

AT = 1_764_000_000_000

SAMPLES: list[Event] = [
    NodeRegistered(
        node="gpu-07",
        gpus=8,
        gpu_model="A100",
        gpu_memory_mib=81920,
        cpu_milli=96000,
        memory_mib=1048576,
        labels={"pool": "train", "topology.kubernetes.io/zone": "r1"},
    ),
    NodeRemoved(node="gpu-07"),
    NodeCordoned(node="gpu-07", cordoned=True),
    QueueConfigured(
        queue="training",
        parent="ml",
        deserved=Resources(gpu_milli=38400, cpu_milli=0, memory_mib=0),
        deserved_gpu_percent=60,
        over_quota_weight=2,
        limit=Resources(gpu_milli=-1, cpu_milli=-1, memory_mib=-1),
        priority=1,
    ),
    QueueRemoved(queue="scratch"),
    JobSubmitted(
        job="finetune-42",
        queue="training",
        pods=(
            PodSpec(name="finetune-42-0", gpu_milli=2000, cpu_milli=8000, memory_mib=65536),
            PodSpec(
                name="finetune-42-1",
                gpu_milli=500,
                cpu_milli=4000,
                memory_mib=16384,
                node_selector={"gpu": "a100"},
            ),
        ),
        min_members=2,
        priority_class="train",
        preemptible=True,
        expected_runtime_ms=7_200_000,
        checkpoint_interval_ms=900_000,
    ),
    JobCancelled(job="finetune-42"),
    PodStarted(job="finetune-42", pod="finetune-42-0"),
    PodFinished(job="finetune-42", pod="finetune-42-0", succeeded=False),
    Tick(),
    PolicyConfigured(
        policy="kai",
        reclaim=True,
        preempt=False,
        share_rounding="whole",
        victim_order="kai",
        queue_order="kai",
        reservations=False,
        backfill_give_way_ms=1_800_000,
    ),
    PodsAllocated(
        job="finetune-42",
        queue="training",
        placements=(
            PodPlacement(
                pod="finetune-42-0", node="gpu-07", gpus=(GpuSlot(0, 1000), GpuSlot(1, 1000))
            ),
            PodPlacement(pod="finetune-42-1", node="gpu-03", gpus=(GpuSlot(5, 500),)),
        ),
    ),
    JobPreempted(
        job="notebook-7",
        queue="interactive",
        pods=("notebook-7-0",),
        preemptor="finetune-42",
        preemptor_queue="training",
        rule="reclaim",
        lost_gpu_ms=2_400_000,
        checkpointed_ms=600_000,
    ),
    JobUnschedulable(
        job="pinned",
        queue="training",
        reason="pod 'pinned-0': node selector {kubernetes.io/hostname=gpu-07} matches no schedulable node",
        final=True,
        cause="never_fits",
    ),
    CycleCompleted(decisions=3),
    PodBound(job="finetune-42", pod="finetune-42-0", node="gpu-07"),
    BindFailed(
        job="finetune-42", pod="finetune-42-1", node="gpu-03", reason="node gpu-03 not found"
    ),
    PodEvicted(job="notebook-7", pod="notebook-7-0", node="gpu-07"),
    GpuUtilizationSampled(node="gpu-07", device=3, utilization_pct=87, memory_used_mib=61440),
    JobRejected(
        job="team-b/llm-pretrain",
        queue="team-a",
        namespace="team-b",
        reason="namespace 'team-b' is not bound to queue 'team-a'",
    ),
    EvictionFailed(
        job="notebook-7",
        pod="notebook-7-0",
        node="gpu-07",
        reason="gave up after 6 attempts: ApiException: 429 Cannot evict pod as it would "
        "violate the pod's disruption budget.",
    ),
    PodDeleted(job="team-a/ddp", pod="ddp-1", node="gpu-07", reason="deleted from the cluster"),
    JobTerminated(
        job="team-a/ddp",
        queue="team-a",
        pods=("ddp-0",),
        reason="gang below its minimum (1 of 2): pod ddp-1 deleted from the cluster",
    ),
]
