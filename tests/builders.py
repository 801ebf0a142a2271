"""Small builders so policy tests read as scenarios: given events, expect decisions."""

from __future__ import annotations

from events.model import (
    CycleCompleted,
    Event,
    JobSubmitted,
    NodeRegistered,
    PodFinished,
    PodSpec,
    PodStarted,
    PolicyConfigured,
    QueueConfigured,
    Resources,
)
from events.port import LedgerWriter
from scheduler.fold.step import Runtime
from scheduler.runtime.engine import Engine


def node(
    name: str,
    gpus: int = 8,
    cpu: int = 0,
    memory: int = 0,
    taints: tuple[str, ...] = (),
    gpu_memory: int = 0,
    **labels: str,
) -> NodeRegistered:
    return NodeRegistered(
        node=name,
        gpus=gpus,
        cpu_milli=cpu,
        memory_mib=memory,
        labels=labels,
        taints=taints,
        gpu_memory_mib=gpu_memory,
    )


def queue(
    name: str,
    parent: str = "",
    deserved: float = 0,
    percent: int | None = None,
    weight: int = 1,
    limit: float | None = None,
    priority: int = 0,
    placement: str = "",
    reclaim_min_runtime_s: int = 0,
    preempt_min_runtime_s: int = 0,
    cpu: int = 0,
) -> QueueConfigured:
    return QueueConfigured(
        queue=name,
        parent=parent,
        deserved=Resources(gpu_milli=round(deserved * 1000), cpu_milli=cpu),
        deserved_gpu_percent=percent,
        over_quota_weight=weight,
        limit=Resources(
            gpu_milli=-1 if limit is None else round(limit * 1000), cpu_milli=-1, memory_mib=-1
        ),
        priority=priority,
        placement=placement,
        reclaim_min_runtime_ms=reclaim_min_runtime_s * 1000,
        preempt_min_runtime_ms=preempt_min_runtime_s * 1000,
    )


def job(
    name: str,
    queue: str,
    pods: int = 1,
    gpus: float = 1,
    min_members: int = 0,
    cls: str = "train",
    selector: dict[str, str] | None = None,
    preemptible: bool | None = None,
    checkpoint_s: int | None = None,
    cpu: int = 0,
    runtime_s: int | None = None,
    groups: tuple[str, ...] = (),
    min_per_group: dict[str, int] | None = None,
    topology: str = "",
    topology_required: bool = False,
    placement: str = "",
    tolerations: tuple[str, ...] = (),
    gpu_memory: int = 0,
) -> JobSubmitted:
    return JobSubmitted(
        job=name,
        queue=queue,
        pods=tuple(
            PodSpec(
                name=f"{name}-{k}",
                gpu_milli=round(gpus * 1000),
                cpu_milli=cpu,
                node_selector=selector or {},
                group=groups[k] if groups else "",
                tolerations=tolerations,
                gpu_memory_mib=gpu_memory,
            )
            for k in range(pods)
        ),
        min_members=min_members,
        priority_class=cls,
        preemptible=preemptible,
        checkpoint_interval_ms=None if checkpoint_s is None else checkpoint_s * 1000,
        expected_runtime_ms=None if runtime_s is None else runtime_s * 1000,
        min_per_group=min_per_group or {},
        topology_key=topology,
        topology_required=topology_required,
        placement=placement,
    )


class World:
    """An engine with a clock; ``at(t, *events)`` runs one cycle and returns its decisions."""

    def __init__(
        self,
        *setup: Event,
        policy: str = "gpuledger",
        writer: LedgerWriter | None = None,
        **knobs: object,
    ) -> None:
        """The setup applied at time 0 under ``policy`` with ``knobs``; every record is
        appended to ``writer`` when given."""
        # The core's own reaction to every input is under test: intake validation is off.
        self.engine = Engine(writer, runtime=Runtime(validating=False))
        config = PolicyConfigured(policy=policy, **knobs)  # type: ignore[arg-type]
        self.engine.step([(config, 0), *((e, 0) for e in setup)], 0)

    @property
    def state(self):  # type: ignore[no-untyped-def]
        return self.engine.state

    def at(self, seconds: float, *events: Event) -> list[Event]:
        now = round(seconds * 1000)
        decisions = self.engine.step([(e, now) for e in events], now)
        assert isinstance(decisions[-1], CycleCompleted)
        return decisions[:-1]

    def start(self, seconds: float, job_id: str) -> list[Event]:
        """All placed pods of a job report running."""
        placed = list(self.state.jobs[job_id].placements)
        return self.at(seconds, *(PodStarted(job=job_id, pod=p) for p in placed))

    def finish(self, seconds: float, job_id: str) -> list[Event]:
        placed = list(self.state.jobs[job_id].placements)
        return self.at(seconds, *(PodFinished(job=job_id, pod=p) for p in placed))

    def status(self, job_id: str) -> str:
        return str(self.state.status_of(job_id))

    def gpus_of(self, queue_name: str) -> float:
        return self.state.queues[queue_name].allocated[0] / 1000
