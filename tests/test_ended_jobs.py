"""Ended jobs leave the core's state (issue 8: memory stays flat).

A job that reaches a terminal status holding nothing is forgotten but for its id, how it
ended and its last attempt (``State.ended``). Nothing anyone can observe may change: the
same decisions as a core that keeps every job, the same refusals at intake, late events
still ignored, and snapshots that round-trip and still read the older format.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import msgspec
import pytest

from events.codec import encode, wrap
from events.model import (
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
    PodSpec,
    PodStarted,
    PolicyConfigured,
    QueueConfigured,
    QueueRemoved,
    Resources,
    Tick,
)
from scheduler.core import State, apply, cycle, ended_attempt, ended_status
from scheduler.core.state import ALLOCATED, RUNNING, TERMINAL, ended_code
from scheduler.fold.snapshot import (
    SNAPSHOT_FORMAT,
    CatchUp,
    Snapshot,
    SnapshotError,
    decode_snapshot,
    encode_snapshot,
    state_bytes,
    state_to_dict,
)
from scheduler.fold.state_at import describe
from scheduler.fold.validate import validate

core_apply = importlib.import_module("scheduler.core.apply")  # the package exports ``apply``


@contextmanager
def keeping_every_job() -> Iterator[None]:
    """The core as it was before ``State.ended``: ended jobs stay whole in ``state.jobs``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(core_apply, "_retire", lambda state, job: None)
        yield


def _job(name: str, queue: str = "q", pods: int = 1, gpus: int = 1000) -> JobSubmitted:
    specs = tuple(PodSpec(name=f"{name}-{k}", gpu_milli=gpus) for k in range(pods))
    return JobSubmitted(job=name, queue=queue, pods=specs)


def _fold(state: State, events: list[Event], now: int) -> list[bytes]:
    for event in events:
        apply(state, event, now)
    return [encode(d, now) for d in cycle(state, now)]


SETUP: list[Event] = [
    PolicyConfigured(policy="gpuledger"),
    NodeRegistered(node="n1", gpus=8),
    NodeRegistered(node="n2", gpus=8),
    QueueConfigured(queue="q", deserved=Resources(gpu_milli=16000)),
]


def _ended_in_each_way(state: State) -> dict[str, str]:
    """Jobs ended each way a job can end; returns job id -> its terminal status."""
    _fold(state, SETUP, 0)
    _fold(
        state, [_job("ok", pods=2), _job("bad"), _job("stop-running"), _job("wait", gpus=8000)], 1
    )
    # A failed bind sends "stop-running" back (attempt 1); the cycle places it again.
    failed = BindFailed(job="stop-running", pod="stop-running-0", node="n1", reason="x")
    _fold(state, [failed, _job("stop-pending", gpus=8000), _job("huge", gpus=64000)], 2)
    for name, pods in (("ok", 2), ("bad", 1), ("stop-running", 1)):
        _fold(state, [PodStarted(job=name, pod=f"{name}-{k}") for k in range(pods)], 3)
    _fold(state, [PodFinished(job="ok", pod="ok-0"), PodFinished(job="ok", pod="ok-1")], 4)
    _fold(state, [PodFinished(job="bad", pod="bad-0", succeeded=False)], 4)
    _fold(state, [JobCancelled(job="stop-running"), JobCancelled(job="stop-pending")], 5)
    return {
        "ok": "succeeded",
        "bad": "failed",
        "stop-running": "cancelled",
        "stop-pending": "cancelled",
        "huge": "unschedulable",
    }


def test_each_way_of_ending_leaves_only_the_id_how_it_ended_and_the_attempt() -> None:
    state = State()
    ended = _ended_in_each_way(state)
    assert {j: ended_status(c) for j, c in state.ended.items()} == ended
    assert {j: ended_attempt(c) for j, c in state.ended.items() if ended_attempt(c)} == {
        "stop-running": 1
    }
    assert not ended.keys() & state.jobs.keys()
    assert all(state.status_of(j) == s for j, s in ended.items())
    assert state.status_of("wait") == "allocated"  # still holding its node
    assert state.status_of("never") is None
    # ``gpuledger state`` counts them from the compact record.
    assert describe(state, 0).ended == "5 jobs: 2 cancelled, 1 failed, 1 succeeded, 1 unschedulable"
    # The keeping core had every one of them, with the same status.
    kept = State()
    with keeping_every_job():
        _ended_in_each_way(kept)
    assert {j: kept.jobs[j].status for j in ended} == ended
    assert describe(kept, 0).ended == describe(state, 0).ended


def test_a_duplicate_of_an_ended_id_is_refused_with_the_same_reason_and_ignored() -> None:
    state, kept = State(), State()
    ended = _ended_in_each_way(state)
    with keeping_every_job():
        _ended_in_each_way(kept)
    for name in ended:
        again = _job(name, pods=3, gpus=500)
        reason = validate(state, again)
        assert reason == f"duplicate job id {name!r}"
        assert reason == validate(kept, again)
        before = state_bytes(state)
        apply(state, again, state.now)  # had it reached the ledger anyway: ignored
        assert state_bytes(state) == before
        with keeping_every_job():
            apply(kept, again, kept.now)
    with keeping_every_job():
        expected = [encode(d, 10) for d in cycle(kept, 10)]
    assert [encode(d, 10) for d in cycle(state, 10)] == expected


LATE: list[Callable[[str, str], Event]] = [
    lambda job, pod: PodStarted(job=job, pod=pod),
    lambda job, pod: PodFinished(job=job, pod=pod),
    lambda job, pod: PodFinished(job=job, pod=pod, succeeded=False),
    lambda job, pod: PodBound(job=job, pod=pod, node="n1"),
    lambda job, pod: BindFailed(job=job, pod=pod, node="n1", reason="gone"),
    lambda job, pod: PodEvicted(job=job, pod=pod, node="n1"),
    lambda job, pod: EvictionFailed(job=job, pod=pod, node="n1", reason="pdb"),
    lambda job, pod: JobCancelled(job=job),
]


@pytest.mark.parametrize("late", LATE, ids=lambda f: type(f("j", "p")).__name__)
def test_late_events_for_an_ended_job_are_accepted_and_ignored(
    late: Callable[[str, str], Event],
) -> None:
    state, kept = State(), State()
    ended = _ended_in_each_way(state)
    with keeping_every_job():
        _ended_in_each_way(kept)
    for name in ended:
        event = late(name, f"{name}-0")
        assert validate(state, event) is None
        assert validate(kept, event) is None  # as before: intake took them
        before = state_bytes(state)
        apply(state, event, state.now)
        assert state_bytes(state) == before
        with keeping_every_job():
            apply(kept, event, kept.now)
    # A late event naming a pod the job never had: the core no longer knows its pods, so
    # intake accepts it too (before, it was refused as an unknown pod); the fold ignores it.
    bogus = late("ok", "ok-9")
    before = state_bytes(state)
    assert validate(state, bogus) is None
    apply(state, bogus, state.now)
    assert state_bytes(state) == before
    with keeping_every_job():
        expected = [encode(d, 10) for d in cycle(kept, 10)]
    assert [encode(d, 10) for d in cycle(state, 10)] == expected


def test_a_long_run_keeps_only_the_live_jobs() -> None:
    """20,000 jobs through a 4-node cluster: the state holds the few live ones."""
    rng = random.Random(8)
    state = State()
    _fold(state, [*SETUP, NodeRegistered(node="n3", gpus=8), NodeRegistered(node="n4", gpus=8)], 0)
    ends: dict[int, list[str]] = {}
    live_most = 0
    done = 0
    total = 20_000
    step = 0
    snapshot_at_half = 0
    while done < total:
        step += 1
        assert step < 50_000, f"stuck at {done} ended"
        inputs: list[Event] = []
        for k in range(2 if step * 2 <= total else 0):
            name = f"j{step}-{k}"
            inputs.append(_job(name, gpus=rng.choice((250, 1000, 4000)), pods=rng.randint(1, 2)))
        for name in ends.pop(step, []):
            job = state.jobs[name]
            inputs += [
                PodFinished(job=name, pod=p, succeeded=rng.random() < 0.9) for p in job.placements
            ]
        if step % 50 == 0 and state.pending:
            inputs.append(JobCancelled(job=state.pending[-1][2]))
        for decision in _fold_events(state, inputs, step):
            if decision.startswith("pods_allocated:"):
                name = decision.split(":", 1)[1]
                ends.setdefault(step + rng.randint(2, 8), []).append(name)
                for pod in state.jobs[name].placements:
                    apply(state, PodStarted(job=name, pod=pod), step)
        done = len(state.ended)
        live = sum(1 for j in state.jobs.values() if j.status not in TERMINAL)
        assert len(state.jobs) == live  # nothing ended is held whole
        live_most = max(live_most, live)
        if done >= total // 2 and not snapshot_at_half:
            snapshot_at_half = len(encode_snapshot("d", state, 0, 0, 0))
    assert len(state.ended) == total and not state.jobs
    assert live_most < 200, live_most  # bounded by what runs and waits, not by the total
    counts = state.status_counts()
    assert set(counts) <= set(TERMINAL) and sum(counts.values()) == total
    # A snapshot grows by a few bytes per ended job (an id and one small int).
    snapshot = len(encode_snapshot("d", state, 0, 0, 0))
    per_job = (snapshot - snapshot_at_half) / (total - total // 2)
    assert per_job < 16, per_job


def _fold_events(state: State, inputs: list[Event], now: int) -> list[str]:
    for event in inputs:
        apply(state, event, now)
    out = []
    for decision in cycle(state, now):
        tag = type(decision).__name__
        job = getattr(decision, "job", "")
        out.append(("pods_allocated" if tag == "PodsAllocated" else tag) + ":" + job)
    return out


def test_a_fifo_gang_that_ends_while_still_pending_is_kept_whole() -> None:
    """fifo half-places a gang; its placed pod finishes, so the job ends (succeeded) while
    its other pod still waits in the pending order, which fifo keeps offering a node. It
    is referred to, so it stays in ``jobs``, and the cycles are those of the keeping core."""
    setup: list[Event] = [PolicyConfigured(policy="fifo"), NodeRegistered(node="n1", gpus=8)]
    steps: list[list[Event]] = [
        [*setup, _job("g", pods=2, gpus=8000), _job("x")],
        [PodStarted(job="g", pod="g-0")],
        [PodFinished(job="g", pod="g-0")],
        [NodeRegistered(node="n2", gpus=8)],
        [JobCancelled(job="g"), PodFinished(job="g", pod="g-1")],
    ]
    state, kept = State(), State()
    for now, events in enumerate(steps):
        decided = _fold(state, events, now)
        with keeping_every_job():
            assert decided == _fold(kept, events, now)
        if now == 2:
            assert state.jobs["g"].status == "succeeded" and state.in_pending(state.jobs["g"])
    assert "g" in state.jobs and "g" not in state.ended


# --------------------------------------------------------------------------- lockstep


class _World:
    """Random inputs for a state, drawn from what the keeping core knows."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.count = 0
        self.gpus = {f"n{i}": self.rng.choice((1, 2, 4, 8)) for i in range(self.rng.randint(2, 5))}
        self.nodes = dict(self.gpus)
        self.removed_nodes: list[str] = []
        self.leaves = ["a", "b", "c"]
        self.removed_queues: list[str] = []

    def setup(self) -> list[Event]:
        events: list[Event] = [PolicyConfigured(policy="gpuledger", backfill=True)]
        events += [NodeRegistered(node=n, gpus=g) for n, g in self.nodes.items()]
        events.append(QueueConfigured(queue="root", deserved=Resources(gpu_milli=4000)))
        events += [self._queue(q) for q in self.leaves]
        return events

    def _queue(self, name: str) -> QueueConfigured:
        rng = self.rng
        return QueueConfigured(
            queue=name,
            parent="root" if name != "c" else "",
            deserved=Resources(gpu_milli=rng.choice((0, 1000, 2000))),
            limit=Resources(gpu_milli=rng.choice((-1, -1, 4000, 8000))),
            over_quota_weight=rng.randint(0, 3),
            priority=rng.choice((0, 0, 1)),
        )

    def _submit(self) -> JobSubmitted:
        rng = self.rng
        self.count += 1
        name = f"j{self.count}"
        pods = rng.choice((1, 1, 1, 2, 3))
        gpus = rng.choice((250, 500, 1000, 2000, 4000, 8000))
        specs = tuple(PodSpec(name=f"{name}-{k}", gpu_milli=gpus) for k in range(pods))
        queues = [*self.leaves, *self.removed_queues, "nowhere", "root"]
        return JobSubmitted(
            job=name,
            queue=rng.choice(queues) if rng.random() < 0.1 else rng.choice(self.leaves),
            pods=specs,
            min_members=rng.randint(0, pods),
            priority_class=rng.choice(("train", "build-preemptible", "build", "inference")),
            preemptible=rng.choice((None, None, True, False)),
            expected_runtime_ms=rng.choice((None, 5000, 60_000)),
            checkpoint_interval_ms=rng.choice((None, 1000)),
        )

    def inputs(self, kept: State) -> list[Event]:
        rng = self.rng
        events: list[Event] = []
        if rng.random() < 0.7:
            events += [self._submit() for _ in range(rng.randint(1, 3))]
        jobs = list(kept.jobs.values())
        if jobs and rng.random() < 0.05:
            old = rng.choice(jobs)
            events.append(JobSubmitted(job=old.job, queue=old.queue, pods=old.pods[:1]))
        for job in jobs:
            pods = list(job.placements)
            if job.status in TERMINAL:
                if rng.random() < 0.02:
                    pod = rng.choice([p.name for p in job.pods] + ["zz"])
                    events.append(rng.choice(LATE)(job.job, pod))
                continue
            for pod in pods:
                if pod not in job.started and rng.random() < 0.5:
                    events.append(PodStarted(job=job.job, pod=pod))
            if job.status == RUNNING and rng.random() < 0.25:
                for pod in pods:
                    if pod not in job.finished and rng.random() < 0.9:
                        events.append(
                            PodFinished(job=job.job, pod=pod, succeeded=rng.random() < 0.9)
                        )
            if job.status == ALLOCATED and pods and rng.random() < 0.03:
                node = job.placements[pods[0]].node
                events.append(BindFailed(job=job.job, pod=pods[0], node=node, reason="x"))
            if pods and rng.random() < 0.05:
                events.append(PodBound(job=job.job, pod=pods[0], node="n0"))
            if rng.random() < 0.01:
                events.append(JobCancelled(job=job.job))
        self._churn(events)
        return events

    def _churn(self, events: list[Event]) -> None:
        rng = self.rng
        if rng.random() < 0.03 and len(self.nodes) > 1:
            name = rng.choice(sorted(self.nodes))
            del self.nodes[name]
            self.removed_nodes.append(name)
            events.append(NodeRemoved(node=name))
        if rng.random() < 0.04:
            if self.removed_nodes and rng.random() < 0.6:
                name = self.removed_nodes.pop(0)
            else:
                name = rng.choice(sorted(self.nodes))
            # Same size here; a node re-announced smaller under a placed pod has its own
            # test (test_a_node_re_announced_smaller_under_a_pod_does_not_crash_the_fold).
            self.nodes[name] = self.gpus[name]
            events.append(NodeRegistered(node=name, gpus=self.nodes[name]))
        if rng.random() < 0.03:
            events.append(
                NodeCordoned(node=rng.choice(sorted(self.nodes)), cordoned=rng.random() < 0.5)
            )
        if rng.random() < 0.02:
            events.append(self._queue(rng.choice(self.leaves)))
        if rng.random() < 0.01 and len(self.leaves) > 1:
            name = self.leaves.pop(rng.randrange(len(self.leaves)))
            self.removed_queues.append(name)
            events.append(QueueRemoved(queue=name))
        if rng.random() < 0.03 and self.removed_queues:
            name = self.removed_queues.pop(0)
            self.leaves.append(name)
            events.append(self._queue(name))
        if rng.random() < 0.02:
            events.append(
                PolicyConfigured(
                    policy=rng.choice(("gpuledger", "gpuledger", "drf", "fifo")),
                    backfill=rng.random() < 0.5,
                    consolidation=rng.random() < 0.3,
                    stale_gang_eviction=rng.random() < 0.5,
                    stale_gang_grace_ms=rng.choice((0, 2000)),
                    bind_backoff_ms=rng.choice((0, 1000)),
                    half_life_ms=rng.choice((0, 60_000)),
                )
            )
        if rng.random() < 0.1:
            events.append(Tick())


@pytest.mark.parametrize("seed", range(24))
def test_forgetting_ended_jobs_changes_no_decision_and_no_refusal(seed: int) -> None:
    """Random inputs — cancels, failed and late pods, node and queue churn, policy
    switches (fifo half-places gangs) — folded in lockstep into the core and into one
    that keeps every job: every cycle decides the same bytes, intake refuses the same."""
    world = _World(seed)
    state, kept = State(), State()
    now = 0
    relaxed = 0
    for step in range(220):
        events = world.setup() if step == 0 else world.inputs(kept)
        now += world.rng.choice((1, 500, 1000, 4000))
        for event in events:
            reason, before = validate(state, event), validate(kept, event)
            if reason != before:
                # The one difference: a late event naming a pod an ended job never had.
                assert reason is None and before is not None and "unknown pod" in before
                assert getattr(event, "job", None) in state.ended
                relaxed += 1
            apply(state, event, now)
            with keeping_every_job():
                apply(kept, event, now)
        decided = [encode(d, now) for d in cycle(state, now)]
        with keeping_every_job():
            expected = [encode(d, now) for d in cycle(kept, now)]
        assert decided == expected, f"seed {seed}, step {step}"
    # What is left: everything but the forgotten jobs is the same state.
    mine, theirs = state_to_dict(state), state_to_dict(kept)
    jobs, kept_jobs, ended = mine.pop("jobs"), theirs.pop("jobs"), mine.pop("ended")
    assert not theirs.pop("ended")
    assert mine == theirs
    assert len(jobs) + len(ended) == len(kept_jobs)
    for name, job in kept.jobs.items():
        if name in state.jobs:
            assert jobs[name] == kept_jobs[name]
        else:
            assert state.ended[name] == ended_code(job.status, job.attempt)
    # The only ended jobs held whole are those still referred to.
    for job in state.jobs.values():
        if job.status in TERMINAL:
            assert job.live() or state.in_pending(job), job
    assert len(state.ended) > 0


# --------------------------------------------------------------------------- snapshots


def test_a_snapshot_round_trips_with_the_ended_jobs() -> None:
    state = State()
    _ended_in_each_way(state)
    data = encode_snapshot("d", state, 7, 3, 40)
    snap, restored = decode_snapshot(data)
    assert snap.format == SNAPSHOT_FORMAT == 2
    assert state_bytes(restored) == state_bytes(state)
    assert list(restored.ended.items()) == list(state.ended.items())  # same order, too
    # ...and it carries on exactly as the original.
    more = [_job("ok"), PodFinished(job="wait", pod="wait-0"), _job("later")]
    assert _fold(restored, more, 20) == _fold(state, more, 20)
    assert state_bytes(restored) == state_bytes(state)


def _format_1(state: State) -> bytes:
    """A snapshot as the previous version wrote it: every job whole, no ``ended``."""
    raw = state_to_dict(state)
    assert raw.pop("ended") == {}
    old = Snapshot(
        domain="d",
        ledger_next=7,
        intake_next=3,
        state=msgspec.Raw(msgspec.msgpack.encode(raw)),
        records=40,
        format=1,
    )
    return msgspec.msgpack.encode(old)


def test_a_format_1_snapshot_is_migrated_as_the_core_would_have_folded_it() -> None:
    state, kept = State(), State()
    _ended_in_each_way(state)
    with keeping_every_job():
        _ended_in_each_way(kept)
    snap, migrated = decode_snapshot(_format_1(kept))
    assert (snap.format, snap.ledger_next, snap.intake_next, snap.records) == (1, 7, 3, 40)
    assert migrated.jobs.keys() == state.jobs.keys()
    assert migrated.ended == state.ended  # (in submission order rather than ending order)
    assert migrated.status_counts() == state.status_counts()
    more = [
        _job("huge"),
        PodFinished(job="wait", pod="wait-0"),
        _job("later"),
        JobCancelled(job="ok"),
    ]
    assert _fold(migrated, more, 20) == _fold(state, more, 20)
    assert state_to_dict(migrated)["queues"] == state_to_dict(state)["queues"]


def test_a_snapshot_of_an_unknown_format_is_refused_so_the_service_replays_the_ledger() -> None:
    data = msgspec.msgpack.encode(
        Snapshot(domain="d", ledger_next=1, intake_next=1, state=msgspec.Raw(b"\x80"), format=9)
    )
    with pytest.raises(SnapshotError, match=r"snapshot format 9, this version reads 1, 2"):
        decode_snapshot(data)


def test_catching_up_from_a_migrated_snapshot_matches_the_recorded_cycles() -> None:
    """The service's restore path: a format-1 snapshot plus the ledger's tail."""
    kept = State()
    with keeping_every_job():
        _ended_in_each_way(kept)
    tail_state = State()
    _ended_in_each_way(tail_state)
    records = []
    inputs: list[Event] = [PodFinished(job="wait", pod="wait-0"), _job("next", pods=2)]
    for event in inputs:
        apply(tail_state, event, 30)
        records.append(wrap(event, 30))
    records += [wrap(d, 30) for d in cycle(tail_state, 30)]
    _, migrated = decode_snapshot(_format_1(kept))
    caught = CatchUp(migrated).feed_all(enumerate(records))
    assert caught.jobs.keys() == tail_state.jobs.keys() == {"next"}
    assert caught.ended == tail_state.ended
