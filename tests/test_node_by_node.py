"""Reclaim's node-by-node choice reads the victims allowed alone only up to its ceiling (the
dearest victim the victim order counted, or the lost-work budget) and is skipped when even
every victim within it could not make room (``Tuning.ceiling_stops``); with the shortcut
off every victim is read and the nodes ranked anyway. The two must write the very same
ledger."""

from __future__ import annotations

import msgspec
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from events.codec import decode_event, encode_envelope
from events.model import JobPreempted
from replay.config import (
    ClusterFile,
    JobSpec,
    NodeGroup,
    PolicyFile,
    QueuesFile,
    QueueSpec,
    WorkloadFile,
    policy_event,
)
from scheduler.core import victims as victims_module
from scheduler.core.tuning import Tuning
from tests.simkit import simulate

Scenario = tuple[ClusterFile, QueuesFile, WorkloadFile]


@st.composite
def packed(draw: st.DrawFn) -> Scenario:
    """Small nodes filled by single-device jobs of several queues (some under a shared
    parent), then gangs of whole-node pods, most in a queue holding nothing yet: the
    victim order's bounds are spent on scattered devices, so node by node is tried."""
    gpus = draw(st.sampled_from([2, 4]))
    nodes = draw(st.integers(2, 5))
    capacity = gpus * nodes
    queues = []
    names = []
    for i in range(draw(st.integers(2, 4))):
        name = f"q{i}"
        names.append(name)
        queues.append(
            QueueSpec(
                name=name,
                parent="org" if i % 2 else "",
                deserved_gpus=draw(st.integers(0, capacity // 2)),
                reclaim_min_runtime_s=draw(st.sampled_from([0, 0, 120])),
            )
        )
    kids = sum(q.deserved_gpus or 0 for q in queues if q.parent)
    queues.append(QueueSpec(name="org", deserved_gpus=draw(st.integers(kids, capacity + kids))))
    queues.append(QueueSpec(name="gangs", deserved_gpus=draw(st.integers(gpus, capacity))))
    spread = draw(st.sampled_from([0, 0, 60]))  # 0: started together, alike lost work
    # a queue's jobs mostly in a run (arrival order), so some nodes hold one queue's alone
    owners = sorted(draw(st.lists(st.sampled_from(names), min_size=capacity,
                                  max_size=capacity + 6)))  # fmt: skip
    if draw(st.booleans()):
        owners = draw(st.permutations(owners))
    jobs = [
        JobSpec(
            name=f"s{i:03d}",
            queue=owner,
            at_s=draw(st.integers(0, spread)),
            runtime_s=draw(st.integers(300, 3000)),
            pods=1,
            gpus_per_pod=draw(st.sampled_from([0.5, 1, 1])),
            expected_runtime_s=draw(st.one_of(st.none(), st.integers(300, 3000))),
        )
        for i, owner in enumerate(owners)
    ]
    jobs += [
        JobSpec(
            name=f"g{i:03d}",
            queue=draw(st.sampled_from([*names, "gangs", "gangs"])),
            at_s=draw(st.integers(60, 900)),
            runtime_s=draw(st.integers(60, 2000)),
            pods=draw(st.integers(1, 2)),
            gpus_per_pod=draw(st.sampled_from([gpus, gpus, gpus / 2])),
            priority_class=draw(st.sampled_from(["train", "build-preemptible"])),
        )
        for i in range(draw(st.integers(1, 5)))
    ]
    cluster = ClusterFile(nodes=[NodeGroup(name="n", count=nodes, gpus=gpus)])
    return cluster, QueuesFile(queues=queues), WorkloadFile(jobs=jobs)


def _scattered() -> Scenario:
    """Five 4-GPU nodes packed one GPU per job, pinned: q0 (17 GPUs, deserving 8) and q1
    (within its quota, one job on each of n1-n3); n4 holds q0's older jobs. q2 then asks
    for a whole node. The victim order takes q0's 9 newest jobs, scattered beside q1's;
    node by node, n0 is the one whose every job may go, as cheap as those (n4's are
    dearer than any the order counted)."""
    jobs = [
        JobSpec(name=f"s{i:03d}", queue="q1" if i % 4 == 1 and i > 4 else "q0", at_s=60,
                runtime_s=5000, pods=1, gpus_per_pod=1, node_selector={"host": str(i // 4)})
        for i in range(16)
    ]  # fmt: skip
    jobs += [
        JobSpec(name=f"old{i}", queue="q0", at_s=0, runtime_s=5000, pods=1, gpus_per_pod=1,
                node_selector={"host": "4"})
        for i in range(4)
    ]  # fmt: skip
    jobs.append(JobSpec(name="gang", queue="q2", at_s=600, runtime_s=600, pods=1, gpus_per_pod=4))
    queues = [
        QueueSpec(name="q0", deserved_gpus=8),
        QueueSpec(name="q1", deserved_gpus=4),
        QueueSpec(name="q2", deserved_gpus=4),
    ]
    nodes = [NodeGroup(name=f"n{i}", count=1, gpus=4, labels={"host": str(i)}) for i in range(5)]
    return ClusterFile(nodes=nodes), QueuesFile(queues=queues), WorkloadFile(jobs=jobs)


def _over_quota() -> Scenario:
    """``_scattered`` with q2 deserving nothing, so the gang's reclaim is over its quota
    and bounded by its lost-work budget (§5), and q0's jobs checkpointing every minute, so
    they are cheap enough for it: the ceiling bounds the node-by-node choice here."""
    cluster, queues, workload = _scattered()
    jobs = [
        msgspec.structs.replace(j, checkpoint_interval_s=60) if j.name.startswith("s") else j
        for j in workload.jobs
    ]
    over = [
        msgspec.structs.replace(q, deserved_gpus=0) if q.name == "q2" else q for q in queues.queues
    ]
    return cluster, QueuesFile(queues=over), WorkloadFile(jobs=jobs)


KNOBS = st.builds(
    PolicyFile,
    lost_work_ratio=st.sampled_from([0.0, 0.1, 1.0]),
    reclaim_hysteresis_s=st.sampled_from([0, 600]),
    victim_order=st.sampled_from(["gpuledger", "gpuledger", "kai"]),
    backfill=st.booleans(),
)


def _ledger(scenario: Scenario, knobs: PolicyFile, *, on: bool) -> list[bytes]:
    cluster, queues, workload = scenario
    policy = policy_event("gpuledger", knobs)
    _, ledger = simulate(cluster, queues, workload, policy, Tuning(ceiling_stops=on))
    return [encode_envelope(env) for env in ledger.records]


def _preempted(scenario: Scenario, tuning: Tuning) -> list[JobPreempted]:
    cluster, queues, workload = scenario
    policy = policy_event("gpuledger", PolicyFile())
    _, ledger = simulate(cluster, queues, workload, policy, tuning)
    events = [decode_event(env) for env in ledger.records]
    return [e for e in events if isinstance(e, JobPreempted)]


@example(_scattered(), PolicyFile())
@example(_scattered(), PolicyFile(lost_work_ratio=0.0))
@example(_over_quota(), PolicyFile())
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(packed(), KNOBS)
def test_the_ceiling_shortcut_writes_the_same_ledger(scenario, knobs) -> None:  # type: ignore[no-untyped-def]
    assert _ledger(scenario, knobs, on=True) == _ledger(scenario, knobs, on=False)


def _counted(scenario: Scenario, tuning: Tuning) -> tuple[int, int, list[str]]:
    """Times the nodes were ranked, victims read, and the gang's victims."""
    counted: dict[str, int] = {}
    real_nodes, real_ordered = victims_module._freeable_nodes, victims_module._Take._ordered

    def nodes(*args, **kwargs):  # type: ignore[no-untyped-def]
        counted["nodes"] = counted.get("nodes", 0) + 1
        return real_nodes(*args, **kwargs)

    def ordered(*args, **kwargs):  # type: ignore[no-untyped-def]
        for row in real_ordered(*args, **kwargs):
            counted["read"] = counted.get("read", 0) + 1
            yield row

    victims_module._freeable_nodes = nodes  # type: ignore[assignment]
    victims_module._Take._ordered = ordered  # type: ignore[method-assign]
    try:
        preempted = _preempted(scenario, tuning)
    finally:
        victims_module._freeable_nodes = real_nodes  # type: ignore[assignment]
        victims_module._Take._ordered = real_ordered  # type: ignore[method-assign]
    gang = sorted(e.job for e in preempted if e.preemptor == "gang")
    return counted.get("nodes", 0), counted.get("read", 0), gang


@example(_over_quota(), PolicyFile(), 0)
@example(_over_quota(), PolicyFile(), 60)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(packed(), KNOBS, st.sampled_from([0, 60, 600]))
def test_stopping_at_the_budget_writes_the_same_ledger(scenario, knobs, checkpoint) -> None:  # type: ignore[no-untyped-def]
    """Reclaim's pass stopped at the lost-work budget (``Tuning.budget_stops``) decides as
    the pass read to its end, with checkpoints making some victims cheap."""
    cluster, queues, workload = scenario
    if checkpoint:
        jobs = [msgspec.structs.replace(j, checkpoint_interval_s=checkpoint) for j in workload.jobs]
        workload = WorkloadFile(jobs=jobs)
    policy = policy_event("gpuledger", knobs)
    ledgers = [
        [encode_envelope(env) for env in simulate(cluster, queues, workload, policy, t)[1].records]
        for t in (Tuning(), Tuning(budget_stops=False))
    ]
    assert ledgers[0] == ledgers[1]


def test_the_example_reclaims_a_whole_node() -> None:
    """The example above reaches the node-by-node choice: the gang's victims are the first
    node's four jobs, the same with the shortcut on and off."""
    for on in (True, False):
        nodes, _, gang = _counted(_scattered(), Tuning(ceiling_stops=on))
        assert nodes > 0 and gang == ["s000", "s001", "s002", "s003"]


def test_over_quota_the_shortcut_reads_less() -> None:
    """Where the ceiling bounds the choice (reclaim beyond the gang's deserved quota), the
    shortcut ranks the nodes no more often and reads no more victims, deciding the same
    (the victim order's pass already stops at the lost-work budget there). The searches
    ``Tuning.lost_floor`` ends before any victim is read are left in, so both read."""
    nodes_on, read_on, gang_on = _counted(
        _over_quota(), Tuning(ceiling_stops=True, lost_floor=False)
    )
    nodes_off, read_off, gang_off = _counted(
        _over_quota(), Tuning(ceiling_stops=False, lost_floor=False)
    )
    assert nodes_on <= nodes_off
    assert 0 < read_on <= read_off
    assert gang_on == gang_off
