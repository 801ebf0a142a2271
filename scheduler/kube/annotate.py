"""Pending pods carry their job's forecast start as an annotation, at a bounded rate.

``gpuledger kube forecast`` computes the forecasts (``replay.forecast``) and hands each
pending job's to ``ForecastAnnotator.update``, which patches the annotation
``gpuledger.io/forecast-start`` on the job's pods — an ISO-8601 time, or ``later than …``
beyond the forecast's horizon — only when the forecast moved by more than a threshold since
it last wrote it, and never more often than once a minute per job: a forecast that wobbles
from one cycle to the next does not become a stream of API writes. A pod that is gone is
passed over. The annotation is for people (``kubectl get pod -o yaml``, a UI); the scheduler
never reads it back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from scheduler.kube.bind import split_job

log = logging.getLogger(__name__)

FORECAST_ANNOTATION = "gpuledger.io/forecast-start"


@dataclass(frozen=True, slots=True)
class PodForecast:
    """A pending job's forecast start for its pods: ``start_ms`` (None: beyond the
    horizon) and the annotation's text."""

    start_ms: int | None
    text: str
    pods: Sequence[str]


@dataclass(slots=True)
class _Written:
    at_s: float
    start_ms: int | None


class ForecastAnnotator:
    """Writes forecasts as pod annotations, when they move and at most once a minute."""

    def __init__(
        self,
        core: client.CoreV1Api,
        *,
        threshold_ms: int = 300_000,
        min_interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``threshold_ms``: the least move of a forecast that is written again;
        ``min_interval_s``: the least time between two writes for one job."""
        self.core = core
        self.threshold_ms = threshold_ms
        self.min_interval_s = min_interval_s
        self.clock = clock
        self.written: dict[str, _Written] = {}
        self.patches = 0

    def _moved(self, last: _Written | None, start_ms: int | None) -> bool:
        if last is None:
            return True
        if last.start_ms is None or start_ms is None:
            return last.start_ms != start_ms
        return abs(start_ms - last.start_ms) > self.threshold_ms

    def update(self, forecasts: Mapping[str, PodForecast]) -> int:
        """Annotate the pods of each job whose forecast is due a write; forget the jobs no
        longer pending. Returns the jobs written."""
        now = self.clock()
        done = 0
        for job in sorted(forecasts):
            f = forecasts[job]
            last = self.written.get(job)
            if last is not None and now - last.at_s < self.min_interval_s:
                continue
            if not self._moved(last, f.start_ms):
                continue
            ns, _ = split_job(job)
            body = {"metadata": {"annotations": {FORECAST_ANNOTATION: f.text}}}
            for pod in f.pods:
                try:
                    self.core.patch_namespaced_pod(pod, ns, body)
                    self.patches += 1
                except ApiException as exc:
                    if exc.status != 404:
                        log.warning("forecast annotation on %s/%s: %s", ns, pod, exc.reason)
            self.written[job] = _Written(now, f.start_ms)
            done += 1
        for job in [j for j in self.written if j not in forecasts]:
            del self.written[job]
        return done


__all__ = ["FORECAST_ANNOTATION", "ForecastAnnotator", "PodForecast"]
