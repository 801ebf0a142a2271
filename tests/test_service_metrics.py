"""The scheduler's Prometheus exposition (``scheduler.runtime.service.Metrics``) without a
broker: rendered through prometheus_client and read back with its parser, label values
escaped; and its HTTP endpoint (``MetricsServer``) on an event loop of its own."""

from __future__ import annotations

import asyncio
import http.client
import signal
import threading

from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from events.model import (
    JobPreempted,
    JobSubmitted,
    NodeRegistered,
    PodSpec,
    QueueConfigured,
    Resources,
)
from scheduler.fold.step import Runtime, live_policy
from scheduler.runtime.service import Metrics, MetricsServer

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

    assert value("gpuledger_queue_allocated_gpus", queue=weird) == 3
    assert value("gpuledger_queue_allocated_gpus", queue="train") == 0
    assert value("gpuledger_allocated_gpus_total") == 3
    assert (
        value("gpuledger_pending_workloads", queue="train") == 1
    )  # 6 GPUs do not fit beside the 3
    assert value("gpuledger_pending_workloads", queue=weird) == 0
    assert value("gpuledger_decisions_total", type="pods_allocated") == 1
    assert value("gpuledger_decisions_total", type="cycle_completed") == 1
    assert value("gpuledger_dead_letters_total", kind="decode") == 2
    assert value("gpuledger_intake_accepted_total") == len(inputs)
    assert value("gpuledger_core_jobs", held="whole") == 2
    assert value("gpuledger_cycle_seconds_count") == 1
    assert value("gpuledger_cycle_seconds_bucket", le="0.005") == 1
    assert value("gpuledger_cycle_seconds_bucket", le="0.0025") == 0
    # Submitted at 2 s, allocated in the cycle at 5 s: 3 s to ready, in the 5 s bucket.
    assert value("gpuledger_admission_wait_time_seconds_sum", queue=weird) == 3
    assert value("gpuledger_admission_wait_time_seconds_bucket", queue=weird, le="1") == 0
    assert value("gpuledger_admission_wait_time_seconds_bucket", queue=weird, le="5") == 1
    assert value("gpuledger_admission_wait_time_seconds_bucket", queue=weird, le="+Inf") == 1
    assert value("gpuledger_queue_fair_share_gpu", queue=weird) > 0
    assert value("gpuledger_queue_deserved_gpus", queue=weird) == 4
    assert value("gpuledger_dead_letters_total", kind="clock") == 0  # every kind, from 0
    # Preemptions count per victim's queue, with the work they threw away.
    assert value("gpuledger_preempted_workloads_total", queue="train") == 0
    preempted = JobPreempted(
        job="j1",
        queue=weird,
        pods=("p",),
        preemptor="j2",
        preemptor_queue="train",
        rule="reclaim",
        lost_gpu_ms=90_000,
    )
    metrics.observe_cycle(0.001, [preempted], rt.state)
    got = _samples(metrics.render(rt.state, domain))
    assert value("gpuledger_preempted_workloads_total", queue=weird) == 1
    assert value("gpuledger_gpu_seconds_lost_to_preemption_total", queue=weird) == 90


def _request(port: int, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def test_metrics_endpoint_serves_get_only_and_leaves_signals_alone() -> None:
    rt = Runtime(validating=False)
    rt.step([(NodeRegistered(node="n1", gpus=8, cpu_milli=64_000, memory_mib=512_000), 0)], 0)
    metrics = Metrics()
    rendered_on: list[threading.Thread] = []

    def render() -> str:
        rendered_on.append(threading.current_thread())
        return metrics.render(rt.state, "default")

    async def main() -> dict[tuple[str, str], tuple[int, dict[str, str], bytes]]:
        sigterm = signal.getsignal(signal.SIGTERM)
        server = MetricsServer(render, "127.0.0.1", 0)
        await server.start()
        try:
            assert server.port != 0
            got = {
                (method, path): await asyncio.to_thread(_request, server.port, method, path)
                for method, path in [
                    ("GET", "/metrics"),
                    ("HEAD", "/metrics"),
                    ("POST", "/metrics"),
                    ("GET", "/nope"),
                    ("GET", "/"),
                ]
            }
            # The service's loop owns SIGTERM and SIGINT; the server installs nothing.
            assert signal.getsignal(signal.SIGTERM) is sigterm
        finally:
            await server.stop()
        return got

    got = asyncio.run(main())
    status, headers, body = got[("GET", "/metrics")]
    assert status == 200
    assert headers["content-type"] == CONTENT_TYPE_LATEST
    samples = _samples(body.decode())
    assert samples[("gpuledger_allocated_gpus_total", frozenset({("domain", "default")}))] == 0
    status, headers, body = got[("HEAD", "/metrics")]
    assert (status, body) == (200, b"")
    status, headers, _ = got[("POST", "/metrics")]
    assert status == 405
    assert set(headers["allow"].split(", ")) == {"GET", "HEAD"}
    assert got[("GET", "/nope")][0] == got[("GET", "/")][0] == 404
    # Rendered on the thread of the loop (here the main one), not in a worker thread.
    assert rendered_on and set(rendered_on) == {threading.main_thread()}
