"""One job-outcome fold: the DuckDB projection and ``replay.metrics`` agree with each other
and with the policy core's own state, on examples, a trace and randomised ledgers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from events.codec import decode_event, wrap
from events.memlog import MemoryLedger
from events.model import (
    BindFailed,
    Event,
    EvictionFailed,
    GpuSlot,
    JobCancelled,
    JobSubmitted,
    NodeRegistered,
    NodeRemoved,
    PodDeleted,
    PodEvicted,
    PodFinished,
    PodPlacement,
    PodsAllocated,
    PodSpec,
    PodStarted,
    PolicyConfigured,
    QueueConfigured,
    Resources,
)
from projections.projector import project
from replay.examples import EXAMPLES, simulate
from replay.metrics import LedgerMetrics, collect, percentile
from replay.sim import Simulation
from replay.traces import import_nodes, import_trace
from scheduler.core import State, apply, ended_status
from scheduler.fold.step import Runtime
from scheduler.runtime.engine import Engine
from tests.test_projector import ListReader
from tests.test_traces import NODES, PODS, needs_alibaba


def _figures_sql(db: Path) -> dict[str, tuple[Any, ...]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute(
            "SELECT job, time_to_ready_s, completion_s, status = 'succeeded', preemptions, "
            "lost_gpu_s, status FROM jobs"
        ).fetchall()
    finally:
        con.close()
    return {r[0]: tuple(r[1:]) for r in rows}


def _figures_metrics(m: LedgerMetrics) -> dict[str, tuple[Any, ...]]:
    def s(ms: int | None) -> float | None:
        return None if ms is None else ms / 1000

    return {
        j.job: (
            s(j.time_to_ready_ms),
            s(j.completion_ms),
            j.succeeded,
            j.preemptions,
            j.lost_gpu_ms / 1000,
            j.status,
        )
        for j in m.jobs.values()
    }


def _percentiles_sql(db: Path) -> list[tuple[Any, ...]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(
            "SELECT queue, p50_ttr_s, p90_ttr_s, p99_ttr_s, "
            "p50_completion_s, p90_completion_s, p99_completion_s "
            "FROM tenant_percentiles ORDER BY queue"
        ).fetchall()
    finally:
        con.close()


def _percentiles_metrics(m: LedgerMetrics) -> list[tuple[Any, ...]]:
    out = []
    for queue in m.queues():
        jobs = [j for j in m.jobs.values() if j.queue == queue]
        ttr = [j.time_to_ready_ms / 1000 for j in jobs if j.time_to_ready_ms is not None]
        done = [j.completion_ms / 1000 for j in jobs if j.completion_ms is not None]
        quantiles = (0.5, 0.9, 0.99)
        out.append(
            (
                queue,
                *(percentile(ttr, q) for q in quantiles),
                *(percentile(done, q) for q in quantiles),
            )
        )
    return out


def assert_projection_agrees(records: list[Any], tmp_path: Path, batch_size: int = 50_000) -> None:
    """The DuckDB ``jobs`` table, ``replay.metrics`` and the core's final state agree."""
    db = tmp_path / "agree.duckdb"
    project(ListReader(records), db, rebuild=True, batch_size=batch_size)
    m = collect(records)
    sql, direct = _figures_sql(db), _figures_metrics(m)
    assert sql.keys() == direct.keys()
    for job, figures in direct.items():
        assert sql[job][-1] == figures[-1], job
        assert sql[job][:-1] == pytest.approx(figures[:-1]), job
    for got, want in zip(_percentiles_sql(db), _percentiles_metrics(m), strict=True):
        assert got[0] == want[0]
        assert got[1:] == pytest.approx(want[1:], abs=1e-6), got[0]
    # … and both say what the core's own fold of the ledger says about every job.
    state = State()
    for offset, env in records:
        apply(state, decode_event(env, offset), env.at)
    for job, figures in direct.items():
        core = state.jobs.get(job)
        status = core.status if core is not None else ended_status(state.ended[job])
        assert figures[-1] == status, job


# --------------------------------------------------------------------------- the case


def test_a_gang_re_placed_after_its_node_is_removed_is_not_done_until_it_finishes_again(
    tmp_path: Path,
) -> None:
    # A 2-pod gang starts; one pod finishes; the other's node is removed; the core re-places
    # the whole gang; in the second attempt only one pod finishes: it is still running.
    def place(pod: str, node: str) -> PodPlacement:
        return PodPlacement(pod=pod, node=node, gpus=(GpuSlot(0, 1000),))

    items: list[tuple[int, Event]] = [
        (0, PolicyConfigured(policy="gpuledger")),
        (0, NodeRegistered(node="n1", gpus=2)),
        (0, NodeRegistered(node="n2", gpus=2)),
        (0, QueueConfigured(queue="team", deserved=Resources(gpu_milli=4000))),
        (0, JobSubmitted(job="g", queue="team", pods=(PodSpec("g-0", 1000), PodSpec("g-1", 1000)))),
        (10, PodsAllocated(job="g", queue="team", placements=(place("g-0", "n1"), place("g-1", "n2")))),
        (20, PodStarted(job="g", pod="g-0")),
        (20, PodStarted(job="g", pod="g-1")),
        (30, PodFinished(job="g", pod="g-0")),
        (40, NodeRemoved(node="n2")),
        (50, PodsAllocated(job="g", queue="team", placements=(place("g-0", "n1"), PodPlacement(pod="g-1", node="n1", gpus=(GpuSlot(1, 1000),))))),
        (60, PodStarted(job="g", pod="g-0")),
        (60, PodStarted(job="g", pod="g-1")),
        (70, PodFinished(job="g", pod="g-0")),
    ]  # fmt: skip
    records = [(offset, wrap(event, at)) for offset, (at, event) in enumerate(items)]
    state = State()
    for at, event in items:
        apply(state, event, at)
    assert state.jobs["g"].status == "running" and state.jobs["g"].attempt == 1

    db = tmp_path / "p.duckdb"
    project(ListReader(records), db)
    con = duckdb.connect(str(db), read_only=True)
    try:
        row = con.execute(
            "SELECT status, ready_at_ms, finished_at_ms, completion_s FROM jobs WHERE job = 'g'"
        ).fetchone()
        pods = con.execute("SELECT pod, status FROM pods ORDER BY pod").fetchall()
        holds = con.execute(
            "SELECT pod, node, from_ms, to_ms, end_reason FROM allocations ORDER BY from_ms, pod"
        ).fetchall()
    finally:
        con.close()
    assert row == ("running", 20, None, None)
    assert pods == [("g-0", "succeeded"), ("g-1", "running")]
    assert holds == [
        ("g-0", "n1", 10, 30, "finished"),
        ("g-1", "n2", 10, 40, "node_removed"),
        ("g-0", "n1", 50, 70, "finished"),
        ("g-1", "n1", 50, None, None),
    ]
    m = collect(records)
    job = m.jobs["g"]
    assert (job.status, job.succeeded, job.finished, job.completion_ms) == (
        "running",
        False,
        None,
        None,
    )
    assert job.time_to_ready_ms == 20
    # GPU time: 20 + 30 ms on the first attempt (10 of it idle), 20 ms of g-0's second run.
    assert job.allocated_gpu_ms == 20 + 30 + 20
    assert job.idle_gpu_ms == 10 + 10 + 10
    assert_projection_agrees(records, tmp_path)


# --------------------------------------------------------------------------- examples, a trace


@pytest.mark.parametrize("policy", ["gpuledger", "fifo"])
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_every_example_projects_the_figures_compare_reports(
    name: str, policy: str, tmp_path: Path
) -> None:
    ledger = MemoryLedger()
    simulate(name, policy, ledger)
    records = list(ledger.read(0))
    assert_projection_agrees(records, tmp_path, batch_size=997)


@needs_alibaba
def test_an_imported_trace_projects_the_figures_compare_reports(tmp_path: Path) -> None:
    imported = import_trace("alibaba-openb", PODS, limit=400)
    ledger = MemoryLedger()
    Simulation(import_nodes(NODES), imported.queues(), imported.workload, "gpuledger", ledger).run()
    records = list(ledger.read(0))
    assert len({env.key for _, env in records if env.type == "job_submitted"}) > 300
    assert_projection_agrees(records, tmp_path)


# --------------------------------------------------------------------------- randomised ledgers

_ACTIONS = ("submit", "submit", "submit", "start", "start", "finish", "cancel", "bind_failed", "node_removed", "pod_deleted",
            "evict", "eviction_failed", "node_back")  # fmt: skip


@st.composite
def live_ledgers(draw: st.DrawFn) -> list[Any]:
    """A ledger written the way the runtime writes one: each step's inputs, then the
    cycle's decisions; the inputs drawn from everything the cluster may report."""
    engine = Engine(runtime=Runtime(validating=False))
    requeue = draw(st.booleans())
    gang = draw(st.sampled_from(["gpuledger", "fifo"]))
    setup: list[Event] = [
        PolicyConfigured(policy=gang, requeue_lost=requeue),
        *(NodeRegistered(node=f"n{i}", gpus=4) for i in range(3)),
        QueueConfigured(queue="a", deserved=Resources(gpu_milli=2000)),
        QueueConfigured(queue="b", deserved=Resources(gpu_milli=10000)),
    ]
    records: list[Any] = []

    def step(inputs: list[Event], now: int) -> None:
        decisions = engine.step([(e, now) for e in inputs], now)
        for event in [*inputs, *decisions]:
            records.append((len(records), wrap(event, now)))

    step(setup, 0)
    jobs = 0
    for t in range(1, draw(st.integers(5, 30)) + 1):
        now = t * 1000
        state = engine.state
        placed = sorted(
            (j.job, p) for j in state.jobs.values() for p in j.placements if p not in j.finished
        )
        action = draw(st.sampled_from(_ACTIONS))
        inputs: list[Event] = []
        if action == "submit" or not placed:
            pods = draw(st.integers(1, 3))
            gpu = draw(st.sampled_from([1000, 2000, 4000]))
            inputs.append(
                JobSubmitted(
                    job=f"j{jobs}",
                    queue=draw(st.sampled_from(["a", "b"])),
                    pods=tuple(PodSpec(f"j{jobs}-{i}", gpu_milli=gpu) for i in range(pods)),
                    min_members=draw(st.integers(0, pods)),
                    priority_class=draw(st.sampled_from(["train", "build"])),
                )
            )
            jobs += 1
        else:
            job, pod = draw(st.sampled_from(placed))
            node = state.jobs[job].placements[pod].node
            match action:
                case "start":
                    inputs += [PodStarted(job=job, pod=p) for p in state.jobs[job].placements]
                case "finish":
                    inputs.append(PodFinished(job=job, pod=pod, succeeded=draw(st.booleans())))
                case "cancel":
                    inputs.append(JobCancelled(job=job))
                case "bind_failed":
                    bound = draw(st.sampled_from(["", node]))
                    inputs.append(
                        BindFailed(job=job, pod=pod, node=node, reason="x", bound_node=bound)
                    )
                case "node_removed":
                    inputs.append(NodeRemoved(node=node))
                case "pod_deleted":
                    inputs.append(PodDeleted(job=job, pod=pod, reason="deleted"))
                case "evict":
                    inputs += [
                        PodEvicted(job=j, pod=p, node=h.node)
                        for j, held in state.held.items()
                        for p, h in held.items()
                    ]
                case "eviction_failed":
                    slots = state.jobs[job].placements[pod].gpus
                    inputs.append(
                        EvictionFailed(job="gone", pod="x", node=node, gpus=slots, reason="pdb")
                    )
                case _:
                    inputs += [NodeRegistered(node=f"n{i}", gpus=4) for i in range(3)
                               if f"n{i}" not in state.nodes]  # fmt: skip
        step(inputs, now)
    return records


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(records=live_ledgers())
def test_randomised_ledgers_project_the_figures_compare_reports(
    records: list[Any], tmp_path: Path
) -> None:
    assert_projection_agrees(records, tmp_path, batch_size=40)


def test_the_random_ledgers_reach_the_facts_they_are_meant_to() -> None:
    # The strategy must produce ledgers with each kind of fact (or the test above is weak).
    seen: set[str] = set()

    @settings(max_examples=60, deadline=None, database=None, derandomize=True)
    @given(live_ledgers())
    def collect_types(records: list[Any]) -> None:
        seen.update(env.type for _, env in records)

    collect_types()
    wanted = {"node_removed", "job_cancelled", "bind_failed", "pod_deleted", "job_preempted",
              "pod_evicted", "job_terminated", "pod_finished"}  # fmt: skip
    assert wanted <= seen, wanted - seen
