"""The simulator's world rules, checked on its ledger."""

from __future__ import annotations

from events.codec import decode_event
from events.model import JobPreempted, PodFinished, PodStarted
from replay.config import ClusterFile, QueuesFile, WorkloadFile, parse
from tests.simkit import demo_inputs, simulate

CLUSTER = "nodes:\n  - {name: n, count: 2, gpus: 8}\ntiming: {bind_latency_s: 1, startup_s: 4}\n"
QUEUES = "queues:\n  - {name: a, deserved_gpus: 8}\n  - {name: b, deserved_gpus: 8}\n"


def run(workload: str, policy: str = "gpuledger"):  # type: ignore[no-untyped-def]
    return simulate(
        parse(CLUSTER, ClusterFile),
        parse(QUEUES, QueuesFile),
        parse(workload, WorkloadFile),
        policy,
    )


def timeline(ledger) -> list[tuple[int, object]]:  # type: ignore[no-untyped-def]
    return [(env.at, decode_event(env)) for env in ledger.records]


def test_a_gang_starts_after_bind_and_startup_and_finishes_after_its_runtime() -> None:
    _, ledger = run(
        "jobs:\n  - {name: g, queue: a, at_s: 10, runtime_s: 100, pods: 2, gpus_per_pod: 8}\n"
    )
    events = timeline(ledger)
    starts = [at for at, e in events if isinstance(e, PodStarted)]
    ends = [at for at, e in events if isinstance(e, PodFinished)]
    assert starts == [15_000, 15_000]  # 10 s + 1 s bind + 4 s startup
    assert ends == [115_000, 115_000]


def test_a_preempted_job_resumes_from_its_last_checkpoint_and_records_lost_work() -> None:
    workload = (
        "jobs:\n"
        "  - {name: a1, queue: a, at_s: 0, runtime_s: 1000, pods: 2, gpus_per_pod: 8, checkpoint_interval_s: 100}\n"
        "  - {name: b1, queue: b, at_s: 255, runtime_s: 50, gpus_per_pod: 8}\n"
    )
    result, ledger = run(workload)
    events = timeline(ledger)
    (preempted,) = [e for _, e in events if isinstance(e, JobPreempted)]
    # a1 ran from 5 s; at 255 s it is 250 s in: checkpoint at 200 s, 50 s x 16 GPUs lost
    assert preempted.checkpointed_ms == 200_000 and preempted.lost_gpu_ms == 50_000 * 16
    a1_ends = [at for at, e in events if isinstance(e, PodFinished) and e.job == "a1"]
    # b1 ends at 255+5+50 = 310 s; a1 restarts (bind+startup) at 315 s with 800 s left
    assert a1_ends == [1_115_000, 1_115_000]
    assert result.statuses == {"succeeded": 2}


def test_fifo_half_places_a_gang_that_then_hangs_holding_gpus() -> None:
    workload = (
        "jobs:\n"
        "  - {name: x, queue: a, at_s: 0, runtime_s: 10, pods: 3, gpus_per_pod: 6}\n"
        "  - {name: y, queue: a, at_s: 0, runtime_s: 10, pods: 2, gpus_per_pod: 2}\n"
    )
    fifo, _ = run(workload, "fifo")
    # x's pods spread 6+6 over both nodes; its third never finds 6 free GPUs on one node,
    # so 12 GPUs sit idle forever after y ends
    assert fifo.statuses == {"pending": 1, "succeeded": 1}
    ours, _ = run(workload, "gpuledger")
    assert ours.statuses == {"succeeded": 1, "unschedulable": 1}  # x can never be packed


def test_demo_runs_every_job_to_an_end_under_gpuledger() -> None:
    result, _ = simulate(*demo_inputs(), "gpuledger")
    assert result.jobs > 200
    assert set(result.statuses) <= {"succeeded", "unschedulable"}


def test_under_contention_every_queue_stays_within_one_gang_of_its_fair_share() -> None:
    from replay.fairness import FairnessMonitor
    from replay.sim import Simulation

    monitor = FairnessMonitor()
    Simulation(*demo_inputs(), "gpuledger").run(observe=monitor.observe)
    assert monitor.queues, "the demo must contend somewhere"
    for name, record in monitor.queues.items():
        assert record.contended_ms > 0
        assert record.within_share >= 0.75, (name, record)
    assert monitor.queues["training"].contended_ms > 3_600_000  # hours, not a blip


def test_backfill_beats_no_backfill_for_the_big_gang_and_the_small_jobs() -> None:
    from replay.config import PolicyFile, load, policy_event
    from replay.sim import Simulation

    inputs = (
        load("replay/examples/backfill-cluster.yaml", ClusterFile),
        load("replay/examples/backfill-queues.yaml", QueuesFile),
        load("replay/examples/backfill-workload.yaml", WorkloadFile),
    )
    results = {
        on: Simulation(*inputs, policy_event("gpuledger", PolicyFile(backfill=on))).run()
        for on in (False, True)
    }

    def small_p90(result) -> int:  # type: ignore[no-untyped-def]
        small = sorted(t for j, t in result.time_to_ready_ms.items() if result.gpus[j] <= 1000)
        return small[(len(small) * 9) // 10]

    off, on = results[False], results[True]
    assert on.time_to_ready_ms["big-gang"] < off.time_to_ready_ms["big-gang"]
    assert small_p90(on) < small_p90(off)
    assert "largest gang big-gang (16 GPUs)" in on.gang_summary()


def test_the_simulator_runs_a_cycle_when_a_hysteresis_window_ends() -> None:
    """Nothing happens after the queue edit at 12 s: b's jobs, held back only by the
    hysteresis of the job a1 placed by reclaim at 10 s, are placed when the window ends
    (610 s, a cycle the core asks for), not whenever the next input happens to come."""
    from events.memlog import MemoryLedger
    from events.model import JobSubmitted, PodsAllocated, PodSpec, PolicyConfigured
    from replay.sim import SimJob, Simulation
    from tests.builders import node, queue

    def submitted(at_s: int, job_id: str, queue_name: str, gpus: int) -> SimJob:
        pods = tuple(PodSpec(name=f"{job_id}-{k}", gpu_milli=1000) for k in range(gpus))
        submission = JobSubmitted(job=job_id, queue=queue_name, pods=pods)
        return SimJob(at_s * 1000, submission, runtime_ms=100_000_000)

    world = [
        (0, node("n1", gpus=4)),
        (0, queue("a", deserved=2)),
        (0, queue("b", deserved=2)),
        (12_000, queue("a")),  # b now deserves all 4, a nothing
        (12_000, queue("b", deserved=4)),
    ]
    jobs = [*(submitted(0, f"b{k}", "b", 1) for k in range(4)), submitted(10, "a1", "a", 2)]
    policy = PolicyConfigured(policy="gpuledger", reclaim_hysteresis_ms=600_000)
    ledger = MemoryLedger()
    Simulation.from_inputs(world, jobs, bind_ms=0, startup_ms=0, policy=policy, writer=ledger).run()
    records = [(env.at, decode_event(env)) for env in ledger.records]
    preempted = [(e.job, e.preemptor, at) for at, e in records if isinstance(e, JobPreempted)]
    assert preempted[-1] == ("a1", "b2", 610_000)
    placed = [(e.job, at) for at, e in records if isinstance(e, PodsAllocated)]
    assert ("b2", 610_000) in placed and ("b3", 610_000) in placed
