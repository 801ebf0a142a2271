"""Forecast annotations through the real API server: ``gpuledger kube forecast`` writes each
pending pod's forecast start, and ``ForecastAnnotator`` writes again only when the forecast
moved by more than its threshold and at most once a minute per job."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import time
from pathlib import Path

from events.filelog import FileLedger
from events.ledgertime import format_at
from events.model import JobSubmitted, NodeRegistered, PodSpec, PodStarted, QueueConfigured
from scheduler.fold.step import Runtime, live_policy
from scheduler.kube.annotate import FORECAST_ANNOTATION, ForecastAnnotator, PodForecast
from tests.kubeharness import KUBECONFIG, Cluster

GPULEDGER = str(Path(sys.executable).parent / "gpuledger")
HOUR_MS = 3_600_000


def _annotation(cluster: Cluster, ns: str, pod: str) -> str | None:
    meta = cluster.core.read_namespaced_pod(pod, ns).metadata
    return (meta.annotations or {}).get(FORECAST_ANNOTATION)


def _ledger(path: Path, ns: str, t0: int) -> int:
    """A live ledger: one 8-GPU node held for an hour by ``holder`` (started), and
    ``waiter`` (the whole node too) pending behind it; returns when ``holder`` ends."""
    rt = Runtime()
    whole = (PodSpec(name="holder", gpu_milli=8000),)
    with FileLedger.open(path) as writer:
        first = rt.step(
            [
                (live_policy(), t0),
                (QueueConfigured(queue="q"), t0),
                (NodeRegistered(node="n1", gpus=8), t0),
                (
                    JobSubmitted(
                        job=f"{ns}/holder", queue="q", pods=whole, expected_runtime_ms=HOUR_MS
                    ),
                    t0,
                ),
            ],
            t0,
        )
        writer.append(first.records)
        started = rt.step([(PodStarted(job=f"{ns}/holder", pod="holder"), t0 + 1000)], t0 + 1000)
        writer.append(started.records)
        waiter = JobSubmitted(
            job=f"{ns}/waiter", queue="q", pods=(PodSpec(name="waiter", gpu_milli=8000),)
        )
        writer.append(rt.step([(waiter, t0 + 2000)], t0 + 2000).records)
    assert rt.state.jobs[f"{ns}/waiter"].status == "pending"
    return t0 + 1000 + HOUR_MS


def test_kube_forecast_annotates_pending_pods(cluster: Cluster, tmp_path: Path) -> None:
    ns = cluster.namespace("forecast")
    cluster.pod(ns, "holder", gpus=8)
    cluster.pod(ns, "waiter", gpus=8)
    t0 = int(time.time() * 1000) - 10_000
    ends = _ledger(tmp_path / "ledger", ns, t0)
    done = subprocess.run(
        [GPULEDGER, "kube", "forecast", "--ledger", str(tmp_path / "ledger"),
         "--kubeconfig", str(KUBECONFIG), "--once"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # waiter starts when holder's hour ends (to the forecast's default precision: ends are
    # rounded up by at most 1/32 of their distance); holder runs: no forecast on it.
    written = _annotation(cluster, ns, "waiter")
    assert written is not None
    at = round(dt.datetime.fromisoformat(written.replace("Z", "+00:00")).timestamp() * 1000)
    assert ends <= at <= ends + HOUR_MS // 32, (written, format_at(ends, True))
    assert _annotation(cluster, ns, "holder") is None


def test_the_annotation_is_written_when_it_moves_and_at_most_once_a_minute(
    cluster: Cluster,
) -> None:
    ns = cluster.namespace("forecast-rate")
    cluster.pod(ns, "p-0", gpus=1)
    now = [1000.0]
    annotator = ForecastAnnotator(cluster.core, threshold_ms=300_000, clock=lambda: now[0])
    job = f"{ns}/p"

    def offer(start_ms: int, text: str) -> int:
        return annotator.update({job: PodForecast(start_ms, text, ("p-0",))})

    assert offer(10 * HOUR_MS, "first") == 1
    assert _annotation(cluster, ns, "p-0") == "first"
    now[0] += 30  # half a minute later, moved by an hour: not yet
    assert offer(11 * HOUR_MS, "moved early") == 0
    assert _annotation(cluster, ns, "p-0") == "first"
    now[0] += 31  # a minute after the write, moved by an hour: written
    assert offer(11 * HOUR_MS, "moved") == 1
    assert _annotation(cluster, ns, "p-0") == "moved"
    now[0] += 600  # long after, moved by 4 minutes: below the threshold
    assert offer(11 * HOUR_MS + 240_000, "wobble") == 0
    assert _annotation(cluster, ns, "p-0") == "moved"
    assert annotator.update({}) == 0 and not annotator.written  # no longer pending
