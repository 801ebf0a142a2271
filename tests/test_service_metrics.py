"""The scheduler's Prometheus exposition (``scheduler.runtime.service.Metrics``) without a broker:
rendered through prometheus_client and read back with its parser, label values escaped."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from events.model import JobSubmitted, NodeRegistered, PodSpec, QueueConfigured, Resources
from scheduler.fold.step import Runtime, live_policy
from scheduler.runtime.service import Metrics

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _samples(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in out, f"{key} twice"
            out[key] = s.value
    return out


def test_metrics_round_trip_with_label_values_that_need_escaping() -> None:
    # Queue and domain names are not Prometheus-safe in general: a quote, a backslash and a
    # newline must come back as they went in, not break the exposition.
    weird, domain = 'team "a"\\b\nc', 'dom"x'
    rt = Runtime(validating=False)
    now = 5_000
    inputs = [
        (live_policy(), 0),
        (QueueConfigured(queue="train", deserved=Resources(gpu_milli=4000)), 0),
        (QueueConfigured(queue=weird, deserved=Resources(gpu_milli=4000)), 0),
        (NodeRegistered(node="n1", gpus=8, cpu_milli=64_000, memory_mib=512_000), 0),
        (JobSubmitted(job="j1", queue=weird, pods=(PodSpec(name="p", gpu_milli=3000),)), 2_000),
        (JobSubmitted(job="j2", queue="train", pods=(PodSpec(name="p", gpu_milli=6000),)), 2_000),
    ]
    result = rt.step(inputs, now)
    metrics = Metrics()
    metrics.observe_cycle(0.004, result.decisions, rt.state)
    metrics.dead_letters["decode"] = 2
    metrics.accepted = len(inputs)
    got = _samples(metrics.render(rt.state, domain))

    def value(name: str, **labels: str) -> float:
        return got[(name, frozenset({"domain": domain, **labels}.items()))]

    assert value("gpuledger_allocated_gpus", queue=weird) == 3
    assert value("gpuledger_allocated_gpus", queue="train") == 0
    assert value("gpuledger_allocated_gpus_total") == 3
    assert value("gpuledger_pending_jobs", queue="train") == 1  # 6 GPUs do not fit beside the 3
    assert value("gpuledger_pending_jobs", queue=weird) == 0
    assert value("gpuledger_decisions_total", type="pods_allocated") == 1
    assert value("gpuledger_decisions_total", type="cycle_completed") == 1
    assert value("gpuledger_dead_letters_total", kind="decode") == 2
    assert value("gpuledger_intake_accepted_total") == len(inputs)
    assert value("gpuledger_core_jobs", held="whole") == 2
    assert value("gpuledger_cycle_seconds_count") == 1
    assert value("gpuledger_cycle_seconds_bucket", le="0.005") == 1
    assert value("gpuledger_cycle_seconds_bucket", le="0.0025") == 0
    # Submitted at 2 s, allocated in the cycle at 5 s: 3 s to ready, in the 5 s bucket.
    assert value("gpuledger_time_to_ready_seconds_sum", queue=weird) == 3
    assert value("gpuledger_time_to_ready_seconds_bucket", queue=weird, le="1") == 0
    assert value("gpuledger_time_to_ready_seconds_bucket", queue=weird, le="5") == 1
    assert value("gpuledger_time_to_ready_seconds_bucket", queue=weird, le="+Inf") == 1
    assert value("gpuledger_queue_fair_share_gpus", queue=weird) > 0
