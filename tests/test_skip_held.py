"""The walk behind a blocked head passes over the jobs admission holds back in one tight
loop (``Tuning.skip_held``); with the shortcut off each is tried in turn. The two must
write the very same ledger, and ``admission_held`` must agree with ``admission_reason``.
So must a cycle that reuses the last cycle's reservations (``Tuning.carry_plans``) and
one that works each out afresh, and one that moves only the queue placed in within the
queue order (``Tuning.rerank_moved``) and one that ranks every queue again, and one that
reuses the last cycle's fair shares (``Tuning.share_memo``) and one that divides afresh.
A cycle that words no reasons (``Tuning.reasons`` off) decides the same: its ledger is
the default one without the waiting jobs' reasons."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from events.codec import decode_envelope, decode_event, encode_envelope, wrap
from events.model import (
    CycleCompleted,
    GpuSlot,
    JobSubmitted,
    JobUnschedulable,
    NodeRegistered,
    PodPlacement,
    PodsAllocated,
    PodSpec,
    PodStarted,
    QueueConfigured,
    Resources,
)
from replay.config import (
    ClusterFile,
    JobSpec,
    NodeGroup,
    PolicyFile,
    QueuesFile,
    QueueSpec,
    Timing,
    WorkloadFile,
    policy_event,
)
from scheduler.core import allocate as allocate_module
from scheduler.core import apply, cycle, fair_shares, pendingblocks
from scheduler.core import backfill as backfill_module
from scheduler.core import policy as policy_module
from scheduler.core.admission import admission_headroom, admission_reason
from scheduler.core.headroom import admission_held
from scheduler.core.placement import Statement
from scheduler.core.state import State
from scheduler.core.tuning import DEFAULT, Tuning
from scheduler.fold.verify import run as replay
from tests.simkit import simulate

CLASSES = ["train", "build-preemptible", "build", "inference"]


@st.composite
def congested(draw: st.DrawFn) -> tuple[ClusterFile, QueuesFile, WorkloadFile]:
    """A small cluster, queues with deserved quotas and limits (GPU, CPU, memory), and
    more work than fits: long backlogs behind blocked heads, many held back by a limit
    or (non-preemptible) by quota."""
    groups = [
        NodeGroup(
            name=f"g{i}",
            count=draw(st.integers(1, 2)),
            gpus=draw(st.sampled_from([1, 2, 4])),
            cpu=draw(st.sampled_from([0, 16])),
            memory_gib=draw(st.sampled_from([0, 64])),
        )
        for i in range(draw(st.integers(1, 2)))
    ]
    capacity = sum(g.count * g.gpus for g in groups)
    queues = []
    names = []
    for i in range(draw(st.integers(1, 3))):
        name = f"q{i}"
        names.append(name)
        queues.append(
            QueueSpec(
                name=name,
                deserved_gpus=draw(st.integers(0, capacity)),
                limit_gpus=draw(st.one_of(st.none(), st.integers(1, capacity))),
                limit_cpu=draw(st.one_of(st.none(), st.sampled_from([4, 12]))),
                limit_memory_gib=draw(st.one_of(st.none(), st.sampled_from([16, 48]))),
                over_quota_weight=draw(st.integers(0, 2)),
            )
        )
    # Half the scenarios state runtimes that hold (a job ends at its expected end or a
    # little after, as a forecast's jobs do): a reservation's walk then meets ends that
    # happen as it expects, which a rule carrying it past them would have to get right.
    stated = draw(st.booleans())
    jobs = []
    for i in range(draw(st.integers(5, 45))):
        runtime = draw(st.integers(10, 2000))
        expected = draw(st.one_of(st.none(), st.integers(10, 2000)))
        if stated:
            expected = runtime - draw(st.sampled_from([0, 0, 5]))
        jobs.append(
            JobSpec(
                name=f"j{i:03d}",
                queue=draw(st.sampled_from(names)),
                at_s=draw(st.integers(0, 900)),
                runtime_s=runtime,
                pods=draw(st.integers(1, 3)),
                gpus_per_pod=draw(st.sampled_from([0, 0.25, 0.5, 1, 2])),
                cpu_per_pod=draw(st.sampled_from([0, 1, 4])),
                memory_gib_per_pod=draw(st.sampled_from([0, 4, 16])),
                priority_class=draw(st.sampled_from(CLASSES)),
                expected_runtime_s=expected,
            )
        )
    # Pods that take long to start move their jobs' expected ends from their placement to
    # their start, past the reservations worked out before (``State.started_end_cache``).
    timing = Timing(startup_s=draw(st.sampled_from([2.0, 2.0, 45.0, 400.0])))
    return (
        ClusterFile(nodes=groups, timing=timing),
        QueuesFile(queues=queues),
        WorkloadFile(jobs=jobs),
    )


def _held_behind_a_limit() -> tuple[ClusterFile, QueuesFile, WorkloadFile]:
    """A 2-GPU gang blocks q0 (limit 3 GPUs) while 1-GPU jobs hold its room; behind it
    jobs a limit holds back and jobs that fit the gap alternate."""
    jobs = [JobSpec(name="j000", queue="q0", at_s=0, runtime_s=600, pods=2)]
    jobs += [
        JobSpec(name=f"j{i:03d}", queue="q0", at_s=1, runtime_s=300 + i, pods=1 + i % 2)
        for i in range(1, 30)
    ]
    return (
        ClusterFile(nodes=[NodeGroup(name="g", count=1, gpus=4)]),
        QueuesFile(queues=[QueueSpec(name="q0", deserved_gpus=2, limit_gpus=3)]),
        WorkloadFile(jobs=jobs),
    )


BACKFILL_KNOBS = st.builds(
    PolicyFile,
    backfill=st.just(True),
    reservations=st.booleans(),
    consolidation=st.booleans(),
    placement=st.sampled_from(["binpack", "spread"]),
    backfill_give_way_s=st.sampled_from([None, 0, 1800]),
)
"""The gang policy's knobs that change how the walk behind a blocked head goes."""


def _ledger(
    scenario: tuple[ClusterFile, QueuesFile, WorkloadFile],
    knobs: PolicyFile,
    tuning: Tuning = DEFAULT,
) -> list[bytes]:
    cluster, queues, workload = scenario
    _, ledger = simulate(cluster, queues, workload, policy_event("gpuledger", knobs), tuning)
    return [encode_envelope(env) for env in ledger.records]


@example(_held_behind_a_limit(), PolicyFile(backfill=True))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    congested(),
    BACKFILL_KNOBS,
)
def test_skipping_held_jobs_writes_the_same_ledger(scenario, knobs) -> None:  # type: ignore[no-untyped-def]
    assert _ledger(scenario, knobs) == _ledger(scenario, knobs, Tuning(skip_held=False))


def test_the_example_walks_past_held_jobs() -> None:
    """The example above reaches the shortcut: with it on, admission is asked of fewer
    jobs than with it off (it passes over those it holds back)."""
    asked: list[int] = []
    real = allocate_module.admission_reason

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        asked[-1] += 1
        return real(*args, **kwargs)

    allocate_module.admission_reason = counting  # type: ignore[assignment]
    try:
        for on in (True, False):
            asked.append(0)
            _ledger(_held_behind_a_limit(), PolicyFile(backfill=True), Tuning(skip_held=on))
    finally:
        allocate_module.admission_reason = real  # type: ignore[assignment]
    assert asked[0] < asked[1]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(congested(), st.integers(0, 200))
def test_admission_held_agrees_with_admission_reason(scenario, upto) -> None:  # type: ignore[no-untyped-def]
    """At any point of a run, for every pending job: ``admission_held`` of its queue's
    headroom says True exactly when ``admission_reason`` gives a reason."""
    cluster, queues, workload = scenario
    _, ledger = simulate(cluster, queues, workload, policy_event("gpuledger", None))
    state: State = replay(ledger, end=min(upto, len(ledger.records))).state
    shares = fair_shares(state)
    for leaf in state.leaf_queues():
        room = admission_headroom(state, leaf, shares)
        for _, _, job_id in leaf.pending:
            job = state.jobs[job_id]
            reason = admission_reason(state, leaf, job, shares)
            assert admission_held(room, job.request, job.preemptible) == (reason is not None)


def held_blocks(on: bool, size: int, probe: int = 0) -> Tuning:
    return Tuning(held_blocks=on, block=size, probe=probe)


@example(_held_behind_a_limit(), PolicyFile(backfill=True), 2, 0)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    congested(),
    BACKFILL_KNOBS,
    st.sampled_from([1, 2, 3, DEFAULT.block]),
    st.sampled_from([0, 1, DEFAULT.probe]),
)
def test_passing_over_held_blocks_writes_the_same_ledger(scenario, knobs, size, probe) -> None:  # type: ignore[no-untyped-def]
    """Passing over whole blocks of held jobs (``pendingblocks``) decides as passing over
    them one by one."""
    blocks = _ledger(scenario, knobs, held_blocks(True, size, probe))
    assert blocks == _ledger(scenario, knobs, held_blocks(False, size))


def test_the_example_passes_over_held_blocks() -> None:
    """The example above reaches the blocks: some block is passed over whole."""
    passed: list[int] = []
    real = pendingblocks.Summary.all_held

    def counting(self, limited, room, now):  # type: ignore[no-untyped-def]
        held = real(self, limited, room, now)
        passed.append(held)
        return held

    pendingblocks.Summary.all_held = counting  # type: ignore[method-assign]
    try:
        _ledger(_held_behind_a_limit(), PolicyFile(backfill=True), held_blocks(True, 2))
    finally:
        pendingblocks.Summary.all_held = real  # type: ignore[method-assign]
    assert any(passed)


def test_the_example_passes_over_a_held_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """In the example above a later walk passes over a run of blocks an earlier one found
    held back whole (``PendingBlocks.held``) in one step; the property above holds it to
    the job-by-job ledger."""
    jumps: list[bool] = []
    real = pendingblocks.HeldRun.holds

    def counting(self, key, limited, room, now):  # type: ignore[no-untyped-def]
        jumps.append(real(self, key, limited, room, now))
        return jumps[-1]

    monkeypatch.setattr(pendingblocks.HeldRun, "holds", counting)
    _ledger(_held_behind_a_limit(), PolicyFile(backfill=True), held_blocks(True, 2))
    assert any(jumps)


def _overrunning() -> tuple[ClusterFile, QueuesFile, WorkloadFile]:
    """A gang's reservation rests on a job expected to end at 100 s that runs on to
    900 s; jobs arrive before, at and after that end."""
    jobs = [JobSpec(name="long", queue="q0", at_s=0, runtime_s=900, expected_runtime_s=100)]
    jobs.append(JobSpec(name="gang", queue="q0", at_s=1, runtime_s=60, pods=2))
    jobs += [
        JobSpec(name=f"j{t:03d}", queue="q0", at_s=t, runtime_s=60, pods=2)
        for t in (50, 99, 100, 150, 400)
    ]
    return (
        ClusterFile(nodes=[NodeGroup(name="g", count=1, gpus=2)]),
        QueuesFile(queues=[QueueSpec(name="q0", deserved_gpus=2)]),
        WorkloadFile(jobs=jobs),
    )


@example(_overrunning(), PolicyFile(backfill=True))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(congested(), BACKFILL_KNOBS)
def test_carrying_reservations_over_writes_the_same_ledger(scenario, knobs) -> None:  # type: ignore[no-untyped-def]
    """Reservations reused from the last cycle (``backfill.carried_plans``) are those the
    cycle would work out: overrunning jobs (runtime past the expected one), jobs without
    an expected runtime and submissions between cycles included."""
    carried = _ledger(scenario, knobs)
    assert carried == _ledger(scenario, knobs, Tuning(carry_plans=False))


def _submissions_only() -> tuple[ClusterFile, QueuesFile, WorkloadFile]:
    """A gang blocked behind a long job while only submissions arrive."""
    jobs = [JobSpec(name="long", queue="q0", at_s=0, runtime_s=900, expected_runtime_s=900)]
    jobs.append(JobSpec(name="gang", queue="q0", at_s=1, runtime_s=60, pods=2))
    jobs += [
        JobSpec(name=f"j{i:02d}", queue="q0", at_s=2 + i, runtime_s=60, pods=2) for i in range(5)
    ]
    return (
        ClusterFile(nodes=[NodeGroup(name="g", count=1, gpus=2)]),
        QueuesFile(queues=[QueueSpec(name="q0", deserved_gpus=2)]),
        WorkloadFile(jobs=jobs),
    )


def _ends_as_stated() -> tuple[ClusterFile, QueuesFile, WorkloadFile]:
    """A 4-GPU gang reserves the node when a 1-hour job ends, while 1-GPU jobs that end
    as stated come and go beside it (each submission, end, placement and start a
    cycle)."""
    jobs = [JobSpec(name="long", queue="q0", at_s=0, runtime_s=3600, expected_runtime_s=3600)]
    jobs.append(JobSpec(name="gang", queue="q1", at_s=1, runtime_s=60, gpus_per_pod=4))
    jobs += [
        JobSpec(
            name=f"j{i:02d}", queue="q0", at_s=2 + 20 * i, runtime_s=300, expected_runtime_s=300
        )
        for i in range(20)
    ]
    return (
        ClusterFile(nodes=[NodeGroup(name="g", count=1, gpus=4)]),
        QueuesFile(
            queues=[QueueSpec(name="q0", deserved_gpus=2), QueueSpec(name="q1", deserved_gpus=2)]
        ),
        WorkloadFile(jobs=jobs),
    )


@pytest.mark.parametrize("scenario", [_submissions_only(), _ends_as_stated()])
def test_the_example_carries_reservations_over(scenario) -> None:  # type: ignore[no-untyped-def]
    """A blocked gang's reservation is reused across submissions, and worked out again
    after anything else: the same ledger either way, with fewer walks."""
    worked_out: list[int] = []
    real = backfill_module.reservation_for, backfill_module.reserve_sizes

    def counting(work):  # type: ignore[no-untyped-def]
        def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
            worked_out[-1] += 1
            return work(*args, **kwargs)

        return counted

    backfill_module.reservation_for = counting(real[0])  # type: ignore[assignment]
    backfill_module.reserve_sizes = counting(real[1])  # type: ignore[assignment]
    try:
        ledgers = []
        for on in (True, False):
            worked_out.append(0)
            ledgers.append(_ledger(scenario, PolicyFile(backfill=True), Tuning(carry_plans=on)))
    finally:
        backfill_module.reservation_for, backfill_module.reserve_sizes = real  # type: ignore[assignment]
    assert ledgers[0] == ledgers[1]
    assert worked_out[0] < worked_out[1]


@st.composite
def many_queues(draw: st.DrawFn) -> tuple[ClusterFile, QueuesFile, WorkloadFile]:
    """Up to eight queues, some under a department with a limit, many small jobs arriving
    together: a cycle places many jobs, in one queue after another."""
    capacity = draw(st.integers(4, 16))
    names = [f"q{i}" for i in range(draw(st.integers(2, 8)))]
    queues = [QueueSpec(name="dept", deserved_gpus=capacity // 2, limit_gpus=capacity // 2)]
    for name in names:
        parent = draw(st.sampled_from(["", "dept"]))
        # the department's children deserve no more than it together
        most = capacity // 2 // len(names) if parent else capacity // 2
        queues.append(
            QueueSpec(
                name=name,
                parent=parent,
                deserved_gpus=draw(st.integers(0, most)),
                limit_gpus=draw(st.one_of(st.none(), st.integers(1, capacity))),
                over_quota_weight=draw(st.integers(0, 3)),
                priority=draw(st.integers(0, 2)),
            )
        )
    jobs = [
        JobSpec(
            name=f"j{i:03d}",
            queue=draw(st.sampled_from(names)),
            at_s=draw(st.sampled_from([0, 0, 0, 60, 600])),
            runtime_s=draw(st.integers(10, 900)),
            pods=draw(st.integers(1, 2)),
            gpus_per_pod=draw(st.sampled_from([0.5, 1, 1, 2])),
            priority_class=draw(st.sampled_from(CLASSES)),
        )
        for i in range(draw(st.integers(5, 40)))
    ]
    cluster = ClusterFile(nodes=[NodeGroup(name="g", count=capacity // 4, gpus=4)])
    return cluster, QueuesFile(queues=queues), WorkloadFile(jobs=jobs)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(congested(), many_queues()), BACKFILL_KNOBS)
def test_moving_only_the_queue_placed_in_writes_the_same_ledger(scenario, knobs) -> None:  # type: ignore[no-untyped-def]
    """The queue order kept across placements, only the queue placed in moved, is the order
    ranked anew (``allocate._rerank``)."""
    moved = _ledger(scenario, knobs)
    assert moved == _ledger(scenario, knobs, Tuning(rerank_moved=False))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(congested(), BACKFILL_KNOBS, st.sampled_from(["milli", "whole"]))
def test_reusing_fair_shares_writes_the_same_ledger(scenario, knobs, rounding) -> None:  # type: ignore[no-untyped-def]
    """A cycle that reuses the last cycle's fair shares (``fairshare.cycle_shares``) decides
    as one that divides them afresh."""
    knobs = msgspec.structs.replace(knobs, share_rounding=rounding)
    assert _ledger(scenario, knobs) == _ledger(scenario, knobs, Tuning(share_memo=False))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(congested(), many_queues()), BACKFILL_KNOBS)
def test_ruling_out_last_cycle_s_failures_writes_the_same_ledger(scenario, knobs) -> None:  # type: ignore[no-untyped-def]
    """A cycle that tries no placement for the shapes that found no room by the end of the
    last one, nothing given back since (``allocate.carried_failures``), decides as one
    that tries each."""
    assert _ledger(scenario, knobs) == _ledger(scenario, knobs, Tuning(carry_failures=False))


def test_the_example_rules_out_last_cycle_s_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    """The submissions-only example reaches the rule: with it, fewer placements are tried
    for the same ledger."""
    tries = []
    place_gang = Statement.place_gang

    def counting(self: Statement, *args, **kwargs):  # type: ignore[no-untyped-def]
        tries.append(None)
        return place_gang(self, *args, **kwargs)

    monkeypatch.setattr(Statement, "place_gang", counting)
    counts = []
    for tuning in (DEFAULT, Tuning(carry_failures=False)):
        tries.clear()
        _ledger(_submissions_only(), PolicyFile(backfill=True), tuning)
        counts.append(len(tries))
    assert counts[0] < counts[1]


def _without_reasons(ledger: list[bytes]) -> list[bytes]:
    """The records that are not a waiting job's reason (a final refusal is a decision),
    each cycle's count of decisions less the reasons left out."""
    kept = []
    dropped = 0  # reasons left out since the last cycle's end
    for record in ledger:
        env = decode_envelope(record)
        event = decode_event(env)
        if isinstance(event, JobUnschedulable) and not event.final:
            dropped += 1
            continue
        if isinstance(event, CycleCompleted):
            counted = CycleCompleted(decisions=event.decisions - dropped)
            kept.append(encode_envelope(wrap(counted, env.at, env.version)))
            dropped = 0
        else:
            kept.append(record)
    return kept


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(congested(), many_queues()), BACKFILL_KNOBS)
def test_a_cycle_without_reasons_decides_the_same(scenario, knobs) -> None:  # type: ignore[no-untyped-def]
    """Off, ``Tuning.reasons`` leaves out the reasons and nothing else."""
    worded = _ledger(scenario, knobs)
    unworded = _ledger(scenario, knobs, Tuning(reasons=False))
    assert unworded == _without_reasons(worded)


def test_the_example_words_reasons_only_when_asked() -> None:
    """The example has waiting jobs, so the comparison above has reasons to leave out."""
    worded = _ledger(_held_behind_a_limit(), PolicyFile(backfill=True))
    assert len(_without_reasons(worded)) < len(worded)


def test_the_walk_goes_on_past_a_cpu_job_placed_in_the_gap() -> None:
    """With no GPU free, the walk behind a blocked head goes on while the queue had a job
    asking for no GPU when the cycle first asked (``allocate._no_room_left``): placing that
    job in the gap does not end the walk before the GPU job behind it is tried and told
    why it waits."""
    state = State()
    apply(state, policy_event("gpuledger"), 0)
    room = Resources(gpu_milli=8000, cpu_milli=64000, memory_mib=64000)
    apply(state, QueueConfigured(queue="q", deserved=room), 0)
    hour = 3_600_000
    for i in range(2):
        node = f"n{i}"
        apply(state, NodeRegistered(node=node, gpus=1, cpu_milli=8000, memory_mib=8000), 0)
        one = (PodSpec(name="p", gpu_milli=1000),)
        running = JobSubmitted(
            job=f"r{i}", queue="q", priority_class="inference", pods=one, expected_runtime_ms=hour
        )
        apply(state, running, 0)
        slot = (GpuSlot(0, 1000),)
        placed = (PodPlacement(pod="p", node=node, gpus=slot),)
        apply(state, PodsAllocated(job=f"r{i}", queue="q", placements=placed), 0)
        apply(state, PodStarted(job=f"r{i}", pod="p"), 0)
    cycle(state, 1)
    for name, pods in (
        ("head", (PodSpec(name="a", gpu_milli=1000), PodSpec(name="b", gpu_milli=1000))),
        ("cpu", (PodSpec(name="c", cpu_milli=1000),)),
        ("gpu", (PodSpec(name="d", gpu_milli=1000),)),
    ):
        submitted = JobSubmitted(
            job=name, queue="q", priority_class="inference", pods=pods, expected_runtime_ms=60_000
        )
        apply(state, submitted, 1000)
    decisions = cycle(state, 2000)
    assert [d.job for d in decisions if isinstance(d, PodsAllocated)] == ["cpu"]
    told = {d.job: d.reason for d in decisions if isinstance(d, JobUnschedulable)}
    assert told["head"].startswith("waiting for a reservation of 2 nodes")
    assert told["gpu"].startswith("waits behind job 'head'")


def _two_kinds_behind_a_gang() -> tuple[ClusterFile, QueuesFile, WorkloadFile]:
    """A cluster with a GPU free per node and a blocked 2-node gang; behind it, arriving
    one by one, 2-GPU jobs of two expected runtimes (two skip keys) that find no room: the
    walks pass over blocks of keys skipped already (``Summary.passes``)."""
    jobs = [
        JobSpec(name=f"run{i}", queue="q0", at_s=0, runtime_s=3000, gpus_per_pod=3)
        for i in range(2)
    ]
    jobs.append(JobSpec(name="gang", queue="q0", at_s=1, runtime_s=100, pods=2, gpus_per_pod=4))
    jobs += [
        JobSpec(
            name=f"j{i:03d}",
            queue="q0",
            at_s=2 + i,
            runtime_s=100,
            gpus_per_pod=2,
            expected_runtime_s=100 + 50 * (i % 2),
        )
        for i in range(24)
    ]
    return (
        ClusterFile(nodes=[NodeGroup(name="g", count=2, gpus=4)]),
        QueuesFile(queues=[QueueSpec(name="q0", deserved_gpus=8)]),
        WorkloadFile(jobs=jobs),
    )


@example(_held_behind_a_limit(), PolicyFile(backfill=True), held_blocks(True, 2))
@example(_two_kinds_behind_a_gang(), PolicyFile(backfill=True), held_blocks(True, 2))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(congested(), many_queues()),
    BACKFILL_KNOBS,
    st.sampled_from([DEFAULT, held_blocks(True, 2)]),
)
def test_numbering_skip_keys_afresh_decides_the_same(scenario, knobs, tuning) -> None:  # type: ignore[no-untyped-def]
    """A cycle after ``allocate.renumber`` (which a live scheduler reaches once it has
    numbered thousands of skip keys or node sets) decides as one before it: the ledger
    replays with the numbers and every memo holding one forgotten before every cycle
    (with blocks of two jobs, the walks read the blocks' summaries of skip keys too)."""
    cluster, queues, workload = scenario
    _, ledger = simulate(cluster, queues, workload, policy_event("gpuledger", knobs))
    renumbered: list[None] = []  # one per cycle renumbered

    def after_renumbering(state: State, emit):  # type: ignore[no-untyped-def]
        state.tuning = tuning  # shortcuts only: the same decisions
        allocate_module.renumber(state)
        # Shift the fresh numbers from cycle to cycle, so a memo left holding an old one
        # would read it as another key.
        for k in range(len(renumbered) % 3):
            state.skip_ids_cache[("shifted", k)] = k
            state.kept_off_ids_cache[("shifted", str(k))] = k + 1
        renumbered.append(None)
        allocate_module.allocate(state, emit)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(policy_module, "allocate", after_renumbering)
        result = replay(ledger)
    assert result.ok, result.mismatch and result.mismatch.diff()
    assert result.cycles == 0 or renumbered


def test_the_example_numbers_afresh_what_it_numbered() -> None:
    """The example above has numbers to forget: the property is not vacuous there."""
    _, ledger = simulate(
        *_held_behind_a_limit(), policy_event("gpuledger", PolicyFile(backfill=True))
    )
    state = replay(ledger).state
    assert state.skip_ids_cache
    allocate_module.renumber(state)
    assert not state.skip_ids_cache and state.failed_cache is None
    assert all(shape.skip_id == -2 for shape in state.shape_cache.values())
